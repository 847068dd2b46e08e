"""A cancel tells the truth: `canceling` while a frozen level may still run the request.

root -> coordinator -> specialist_a, specialist_b, each its own `vox-agent` process on one
real broker (tests/kits/lifecyclekit.py, `pair_fleet`). Both specialists are frozen
(SIGSTOP) before the request is sent, so the request the coordinator delegates waits in a
frozen process's socket; the operator works only with `vox`: `send --detach`, `cancel`,
`request show` (docs/operations.md, "Find and cancel a stuck command"). After SIGCONT the
specialist may still run it: the operator must never have heard `canceled` before that,
and the final report says what happened (protocol/canceling.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.clikit import capture
from tests.kits.fleetproc import FleetProcesses
from tests.kits.lifecyclekit import (
    PAIR,
    event_at,
    ledger_rows,
    pair_fleet,
    route_up,
    until,
)

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

# A frozen specialist stays a healthy, connected child for the whole frozen part of the test
# (three heartbeats, 1.5 keepalives): the request is delegated to it and waits in its socket.
HEARTBEAT = 15.0
KEEPALIVE = 60


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[FleetProcesses, Path]]:
    with pair_fleet(tmp_path / "fleet", heartbeat=HEARTBEAT, keepalive=KEEPALIVE) as found:
        yield found


def downstream_of(path: Path, n: int) -> dict[str, Any] | None:
    """The coordinator's `sent` row of run n's request, delegated to a specialist, or None."""
    for row in ledger_rows(path):
        if row["message_type"] != "command_request" or row["action"] != "sent":
            continue
        details = json.loads(row["details"] or "{}")
        if isinstance(details, dict) and details.get("params", {}).get("n") == n:
            return row
    return None


def levels(report: dict[str, Any]) -> list[str]:
    """Return each level's state of a nested report, the root's first."""
    found = []
    part: Any = report
    while isinstance(part, dict):
        found.append(part["state"])
        part = part.get("below")
    return found


async def test_a_cancel_held_by_frozen_specialists_is_canceling_until_they_thaw(
    fleet: tuple[FleetProcesses, Path], capture: Any
) -> None:
    procs, events_file = fleet
    config = procs.operator_config
    await route_up(procs, "analyze")
    frozen = [procs.agents[name] for name in PAIR]
    for agent in frozen:
        agent.signal(signal.SIGSTOP)
    try:
        code, out, err = await capture(
            "send", "--config", config, "analyze", "n=1", "target=frozen", "--detach", "--json",
            "--timeout", "600",
        )  # fmt: skip
        assert (code, err) == (0, ""), err
        request_id = UUID(json.loads(out)["request_id"])
        coordinator = procs.ledger("coordinator")
        sent = await until(lambda: downstream_of(coordinator, 1), "the coordinator to delegate")

        # The cancel: root and coordinator stop, but the specialist holding it cannot say.
        code, out, err = await capture("cancel", str(request_id), "--wait", "6", "--config", config)
        assert (code, err) == (3, ""), (code, out, err)
        assert out.startswith(f"request {request_id}: canceling since "), out
        assert "level 3 has not confirmed" in out, out
        assert "canceled" not in out, out

        code, out, err = await capture(
            "cancel", str(request_id), "--wait", "4", "--json", "--config", config
        )
        assert code == 3, (code, out, err)
        said = json.loads(out)
        assert (said["state"], said["level"]) == ("canceling", 3), said

        code, out, err = await capture(
            "request", "show", str(request_id), "--json", "--config", config
        )
        assert (code, err) == (0, ""), err
        report = json.loads(out)
        assert levels(report) == ["canceling", "canceling", "unreachable"], report
        assert report["cancel"]["state"] == "canceling", report
        code, out, err = await capture("request", "show", str(request_id), "--config", config)
        assert code == 0, err
        assert "level 3 has not confirmed" in out, out
        assert "the level below has not confirmed the cancel" in out, out
        assert event_at(events_file, "analyzed", 1) is None  # frozen: it cannot have run
    finally:
        for agent in frozen:
            agent.signal(signal.SIGCONT)

    # Thawed: the specialist either runs the request it already held, then answers the
    # cancel with its end, or never starts it. Until then every report said canceling.
    async def settled() -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:
            code, out, err = await capture(
                "request", "show", str(request_id), "--json", "--config", config
            )
            assert (code, err) == (0, ""), err
            found: dict[str, Any] = json.loads(out)
            if found["cancel"]["state"] != "canceling":
                return found
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.2)  # the next look, until the thawed level has answered

    final = await settled()
    ran = event_at(events_file, "analyzed", 1)
    code, out, err = await capture("cancel", str(request_id), "--config", config)
    said_line = out.strip().removeprefix(f"request {request_id}: ")
    assert said_line == final["cancel"]["line"], (out, final)
    if levels(final) == ["canceled"] * 3:
        # It never ran, or the cancel reached it while it ran: its answer was CANCELED, and
        # the report says whether its handler had started.
        assert (code, final["cancel"]["state"]) == (0, "canceled"), (code, out, final)
        if ran is not None:  # (a handler cut before its first line started, and never ran)
            assert "its handler had started at level 3 before the cancel came" in said_line
        return
    # It ran to its end before the cancel reached it: the final report says so, and the
    # coordinator recorded the result that came after its cancel.
    assert ran is not None, final
    assert levels(final) == ["canceled", "canceled", "completed"], final
    assert (final["cancel"]["state"], final["cancel"]["level"]) == ("completed", 3), final
    assert code == 1, (code, out, err)
    assert "but level 3 had completed since" in said_line, said_line
    rows = ledger_rows(procs.ledger("coordinator"))
    canceled_at = min(
        r["id"] for r in rows if r["action"] == "canceled" and r["message_id"] == str(request_id)
    )
    late = [
        r
        for r in rows
        if r["reply_to"] == sent["message_id"]
        and r["message_type"] == "command_result"
        and r["action"] == "received"
    ]
    assert late, "the result that came after the cancel is not in the coordinator's ledger"
    assert late[0]["id"] > canceled_at, late
