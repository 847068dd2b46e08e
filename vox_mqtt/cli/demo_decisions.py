"""`vox demo`'s decision step: three overlapping jobs, the human approves one and rejects one.

An undecided job holds no time, so all three reach the operator; the approved one alone is
booked; a later job that overlaps it does not fit, one that overlaps only the rejected one
is notified (examples/README.md, decisions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.text import Text

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.hierarchy import Fleet

from .localfleet import DemoLayout, Ledgers, VoxRun

__all__ = ["DecisionStep", "Narrator"]


class Narrator(Protocol):
    """What the step uses of the demo: its files, its output, its `vox` runner."""

    layout: DemoLayout
    ledgers: Ledgers
    fleet: Fleet
    out: Console

    def title(self, text: str) -> None: ...
    def say(self, text: str) -> None: ...
    def shown(self, path: Path) -> str: ...
    def vox(self, *args: str, check: bool = True) -> Awaitable[VoxRun]: ...


Mail = Callable[[str, str, datetime, datetime, int, str, str], str]


class DecisionStep:
    """The narrated decision step, run once after the first job arrived by e-mail."""

    def __init__(self, demo: Narrator, *, intake: Path, tuesday: datetime, mail: Mail) -> None:
        self.demo = demo
        self.intake = intake
        self.tuesday = tuesday
        self.mail = mail
        self._seen: set[str] = set()

    async def run(self) -> None:
        """Three overlapping jobs, two decisions, a refusal, two more jobs, the trace."""
        demo = self.demo
        demo.title("The human decides: three overlapping jobs, one approved, one rejected")
        op = str(demo.layout.config("operator"))
        await self._notified_so_far()
        since = self._log_size("coordinator")
        demo.say(
            "three jobs for the same Tuesday, each overlapping the other two; each fits the "
            "coordinator's 09:00-17:00 alone, no two together, and an undecided job holds no "
            "time, so all three reach the operator:"
        )
        for name, start, end, effort, price in (
            ("4-atlas.eml", 9, 13, 180, "40 USD"),
            ("5-borealis.eml", 11, 17, 240, "60 USD"),
            ("6-cobalt.eml", 10, 12, 90, "25 USD"),
        ):
            # One at a time, so each notification names the undecided jobs before it.
            await self._drop_and_wait(name, start, end, effort, price, notified=True)
        self._show_log("coordinator", since, ("fits",))
        await demo.vox("inbox", "--config", op, "--wait", "1")
        # Job #2 as the operator's console keeps it: its id is what the root notified.
        atlas = self._kept_job(2)
        since = self._log_size("coordinator")
        await demo.vox("decide", "--config", op, "2", "approve", "--note", "Atlas: yes")
        await demo.vox("decide", "--config", op, "3", "reject")
        refused = await demo.vox("decide", "--config", op, "3", "approve", check=False)
        if refused.code != 2:
            raise VoxError(f"deciding job #3 twice exited {refused.code}, not 2")
        demo.say(f"  [dim](exit {refused.code}: a decision is final)[/]")
        self._show_log("coordinator", since, ("booked", "rejected"))
        demo.say(
            "two more jobs: one overlaps the approved Atlas job, one overlaps only the "
            "rejected Borealis job:"
        )
        since = self._log_size("coordinator")
        await self._drop_and_wait("7-dune.eml", 9, 12, 120, "35 USD", notified=False)
        await self._drop_and_wait("8-ember.eml", 14, 17, 120, "45 USD", notified=True)
        self._show_log("coordinator", since, ("fits", "does not fit"))
        demo.say(
            "the root's ledger holds the job, its notification, the decision, the decision it "
            "relayed to the coordinator and both answers in one reply_to chain:"
        )
        await demo.vox("ledger", str(demo.ledgers.path("root")), "trace", atlas[:8])

    async def _drop_and_wait(
        self, name: str, start: int, end: int, effort: int, price: str, *, notified: bool
    ) -> None:
        """Write one job mail as the intake format asks, then wait for its outcome."""
        day = self.tuesday
        text = self.mail(
            "Orders <orders@example.org>",
            name.split("-", 1)[1].removesuffix(".eml").capitalize(),
            day.replace(hour=start),
            day.replace(hour=end),
            effort,
            price,
            f"Job {name}: {effort} minutes of work.",
        )
        tmp = self.intake / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.intake / name)
        self.demo.say(f"  wrote {self.demo.shown(self.intake / name)}  [dim]({start}:00-{end}:00, "
                      f"{effort} min, {price})[/]")  # fmt: skip
        if notified:
            row = await self.demo.ledgers.wait_for(
                "root",
                self._new_notification,
                what=f"the root's notification of {name}",
            )
            self._seen.add(row["message_id"])
        else:
            last = max((r["id"] for r in await self._not_notified()), default=0)
            await self.demo.ledgers.wait_for(
                "coordinator",
                lambda r: (
                    (r["event_type"], r["action"]) == ("job", "not_notified") and r["id"] > last
                ),
                what=f"the coordinator's not_notified row of {name}",
            )

    def _kept_job(self, number: int) -> str:
        """Return the message id of job #number in the operator's inbox file."""
        inbox = self.demo.layout.state("operator") / "inbox.jsonl"
        entries = [json.loads(line) for line in inbox.read_text(encoding="utf-8").splitlines()]
        ids = list(dict.fromkeys(e["message_id"] for e in entries if e["type"] == "job_detected"))
        if len(ids) < number:
            raise VoxError(f"the operator's inbox holds {len(ids)} job(s), not {number}")
        return str(ids[number - 1])

    async def _not_notified(self) -> list[dict[str, Any]]:
        rows = await self.demo.ledgers.rows("coordinator")
        return [r for r in rows if (r["event_type"], r["action"]) == ("job", "not_notified")]

    async def _notified_so_far(self) -> None:
        for row in await self.demo.ledgers.rows("root"):
            if self._is_notification(row):
                self._seen.add(row["message_id"])

    def _is_notification(self, row: dict[str, Any]) -> bool:
        operator = str(self.demo.fleet.operator_id)
        return (row["message_type"], row["action"], row["target"]) == (
            "job_detected",
            LedgerAction.SENT,
            operator,
        )

    def _new_notification(self, row: dict[str, Any]) -> bool:
        return self._is_notification(row) and row["message_id"] not in self._seen

    def _log_size(self, name: str) -> int:
        try:
            return self.demo.layout.log(name).stat().st_size
        except FileNotFoundError:
            return 0

    def _show_log(self, name: str, since: int, needles: tuple[str, ...]) -> None:
        """Print the lines of an agent's log written since an offset that hold a needle."""
        path = self.demo.layout.log(name)
        self.demo.say(f"[dim]{self.demo.shown(path)}:[/]")
        with path.open("rb") as handle:
            handle.seek(since)
            text = handle.read().decode(errors="replace")
        for line in text.splitlines():
            if "examples.freelance" in line and any(n in line for n in needles):
                self.demo.out.print(Text(f"  {line}"))
