"""A `vox-agent` daemon that SIGKILLs itself just before or just after a chosen ledger commit.

`python -m tests.kits.killpoint --config FILE` runs the daemon unchanged, except that the
ledger's one commit function (`write_batch`, docs/ledger.md "One writer thread") is wrapped.
While the file named by `$VOX_TEST_KILLPOINT` exists, each batch is matched against the
`KillPoint` it holds; at the first batch holding a matching row the wrapper records the
batch's rows beside it (`.fired`), removes the arm file and kills its own process, before
the commit or right after it (on the writer thread, so nothing after the commit ran yet).
A restarted daemon therefore runs unarmed until the test arms it again.

Points are named by rows, not by code: the commit holding a `received` `command_request`,
the one holding `started`, `delegated`, an answer's `sent`, an ack's `received` of a given
kind. A row belongs to the command under test when its details name that command, or when it
replies to a message that does (an acknowledgement), so other traffic never fires a point.

Also here: `Standby`, the next run of a daemon started ahead of its restart, and `Counted`,
an idempotent command that counts its runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from tests.kits.fleetproc import REPO, AgentProcess, child_env
from vox_mqtt.agent.roles import Role, command

ENV = "VOX_TEST_KILLPOINT"
GO = "VOX_TEST_STANDBY"  # a standby daemon waits for this file before it starts
MODULE = "tests.kits.killpoint"


@dataclass(frozen=True)
class KillPoint:
    """Kill `when` the first commit holding a row (action, message_type) of `command`."""

    when: Literal["before", "after"]
    action: str
    message_type: str
    command: str
    acks: str | None = None  # for an ack's row: the type of the message it acknowledges

    @property
    def label(self) -> str:
        acked = f"({self.acks})" if self.acks else ""
        return f"{self.when}-{self.action}-{self.message_type}{acked}"

    def arm(self, path: Path) -> None:
        """Write the point where the daemon looks for it (atomically: it reads it per commit)."""
        fired(path).unlink(missing_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)


def fired(path: Path) -> Path:
    """Return where the daemon writes the rows of the batch it died at."""
    return path.with_name(path.name + ".fired")


class _Matcher:
    """Follows the rows of one command through the batches and says when a point is reached."""

    def __init__(self, point: KillPoint) -> None:
        self.point = point
        self.related: dict[str, str] = {}  # message_id -> message_type, of the command's messages

    def hit(self, rows: Sequence[dict[str, Any]]) -> bool:
        """Return whether this batch holds the point's row; learn the command's messages first."""
        for row in rows:
            details = _details(row)
            if details.get("command") == self.point.command and row["message_id"]:
                self.related[row["message_id"]] = row["message_type"]
        return any(self._is_point(row) for row in rows)

    def _is_point(self, row: dict[str, Any]) -> bool:
        point = self.point
        if (row["action"], row["message_type"]) != (point.action, point.message_type):
            return False
        if point.acks is not None:
            return self.related.get(row["reply_to"] or "") == point.acks
        return row["message_id"] in self.related


def _details(row: dict[str, Any]) -> dict[str, Any]:
    try:
        found = json.loads(row["details"] or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


class _Armed:
    """The arm file as the writer thread sees it: re-read only when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: int | None = None
        self.matcher: _Matcher | None = None

    def current(self) -> _Matcher | None:
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._stamp, self.matcher = None, None
            return None
        if stamp != self._stamp:
            self._stamp = stamp
            self.matcher = _Matcher(KillPoint(**json.loads(self.path.read_text())))
        return self.matcher

    def fire(self, rows: Sequence[dict[str, Any]]) -> None:
        """Leave the batch's rows for the test, disarm, and die as a crash would."""
        fired(self.path).write_text(json.dumps([dict(row) for row in rows]))
        self.path.unlink(missing_ok=True)
        os.kill(os.getpid(), signal.SIGKILL)


def install(arm_file: Path) -> Callable[..., Any]:
    """Wrap the ledger's commit function wherever it was imported; return the original."""
    import vox_mqtt.ledger.store  # noqa: F401 - its import of write_batch is what is replaced
    from vox_mqtt.ledger import _schema, _writer

    original: Callable[..., Any] = _writer.write_batch
    columns = (*_schema._COLUMNS, "prev_hash", "hash")
    armed = _Armed(arm_file)

    def write_batch(db: sqlite3.Connection, rows: list[tuple[Any, ...]], *args: Any) -> Any:
        matcher = armed.current()
        if matcher is None:
            return original(db, rows, *args)
        named = [dict(zip(columns, row, strict=True)) for row in rows]
        if not matcher.hit(named):
            return original(db, rows, *args)
        if matcher.point.when == "before":
            armed.fire(named)
        result = original(db, rows, *args)
        armed.fire(named)
        return result

    patched = [
        module
        for module in list(sys.modules.values())
        if getattr(module, "write_batch", None) is original
    ]
    # If the ledger no longer commits through write_batch, say so instead of never firing.
    assert patched, "no module calls vox_mqtt.ledger._writer.write_batch any more"
    for module in patched:
        module.write_batch = write_batch  # type: ignore[attr-defined]
    return original


class Counted(Role):
    """An idempotent command that counts its runs in a file, one line per run."""

    @command(idempotent=True)
    async def count(self, n: int) -> int:
        path = self.settings["tally_file"]
        await asyncio.to_thread(_append_line, path, f"{n}\n")
        return n


def _append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)


class Standby:
    """The next run of a daemon, started ahead: imports done, waiting for `go()` to start.

    A restart then costs what the daemon's own start costs, not Python's imports: the
    process is new and its state comes from disk only, as after any restart.
    """

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        # One file per standby: a later standby must never take or remove this one's signal.
        self.go_file = agent.log_path.with_name(f"{agent.name}-{uuid.uuid4().hex[:8]}.go")
        with agent.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", MODULE, "--config", str(agent.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env() | dict(agent.env) | {GO: str(self.go_file)},
                cwd=REPO,
                start_new_session=True,
            )

    def go(self) -> None:
        """Reap the agent's previous run (it must have ended) and let this one start."""
        previous = self.agent.process
        assert previous is None or previous.poll() is not None, "the daemon still runs"
        self.agent.process = self.process
        self.go_file.touch()

    def cancel(self) -> None:
        """Stop a standby that was never let go."""
        if self.agent.process is not self.process:
            self.process.kill()
            self.process.wait(10)


def main(argv: Sequence[str]) -> int:
    """Install the wrapper (if $VOX_TEST_KILLPOINT is set), then run the daemon as is."""
    if arm := os.environ.get(ENV):
        install(Path(arm))
    from agent_daemon.__main__ import main as daemon_main

    if go := os.environ.get(GO):
        deadline = time.monotonic() + 300  # a standby nobody lets go does not linger
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                return 1
            time.sleep(0.005)
        os.unlink(go)
    return daemon_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
