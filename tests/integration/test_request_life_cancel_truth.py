"""A cancel tells the truth: `canceling` while a frozen level may still run the request.

root -> coordinator -> specialist_a, specialist_b, each its own `vox-agent` process on one
real broker (tests/kits/lifecyclekit.py, `pair_fleet`). Both specialists are frozen
(SIGSTOP) before the request is sent, so the request the coordinator delegates waits in a
frozen process's socket; the operator works only with `vox`: `send --detach`, `cancel`,
`request show` (docs/operations.md, "Find and cancel a stuck command"). After SIGCONT the
specialist may still run it: the operator must never have heard `canceled` before that,
neither from `vox cancel` and `vox request show` nor as the answer to its request (the root
answers only with its child's confirmation, docs/messages.md "A cancel tells the truth"),
and the final report and answer say what happened (protocol/canceling.py).
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
from tests.kits.fleetproc import FleetProcesses, wait_for_route
from tests.kits.killfleet import asked
from tests.kits.lifecyclekit import (
    PAIR,
    event_at,
    ledger_rows,
    pair_fleet,
    route_up,
    until,
)
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.actions import AFTER_CANCEL
from vox_mqtt.protocol.canceling import AFTER_CANCEL_WHY, cancel_verdict
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, ErrorCode
from vox_mqtt.protocol.topics import STATUS_FILTER

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

# A frozen specialist stays a healthy, connected child for the whole frozen part of the test
# (three heartbeats, 1.5 keepalives): the request is delegated to it and waits in its socket.
HEARTBEAT = 15.0
KEEPALIVE = 60
# The deadline of a request whose cancel a frozen level never confirms.
DEADLINE = 8.0


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


# A request's rows at one level that say how its cancel went (re-sent copies aside).
ENDS = ("canceling", "canceled", "completed", "failed")


def answer_of(path: Path, request_id: str) -> dict[str, Any] | None:
    """The `sent` row of an agent's answer to a request it received, or None."""
    answers = ("command_result", "command_error")
    for row in ledger_rows(path):
        if (row["action"], row["reply_to"]) == ("sent", request_id) and (
            row["message_type"] in answers
        ):
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
        # Nor has anyone answered the request: the root and the coordinator wait for the
        # frozen level's confirmation, so the operator's `vox send` (or console) hears no
        # CANCELED while a level has not confirmed.
        assert answer_of(procs.ledger("root"), str(request_id)) is None
        assert answer_of(coordinator, str(sent["reply_to"])) is None
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
    # The root's answer, relayed from the level that confirmed or ran it.
    answer = await until(
        lambda: answer_of(procs.ledger("root"), str(request_id)), "the root's answer", 60
    )
    answered = json.loads(answer["details"] or "{}")
    code, out, err = await capture("cancel", str(request_id), "--config", config)
    said_line = out.strip().removeprefix(f"request {request_id}: ")
    assert said_line == final["cancel"]["line"], (out, final)
    if levels(final) == ["canceled"] * 3:
        # It never ran, or the cancel reached it while it ran: its answer was CANCELED, and
        # the report says whether its handler had started.
        assert (code, final["cancel"]["state"]) == (0, "canceled"), (code, out, final)
        assert answer["message_type"] == "command_error", answer
        assert answered["code"] == "CANCELED", answer
        if ran is not None:  # (a handler cut before its first line started, and never ran)
            assert "its handler had started at level 3 before the cancel came" in said_line
        return
    # It ran to its end before the cancel reached it: the final report says so, the result
    # is the root's answer, and the levels above recorded it as a result after their cancel.
    assert ran is not None, final
    assert levels(final) == ["completed"] * 3, final
    assert final["why"] == final["below"]["why"] == AFTER_CANCEL_WHY, final
    assert answer["message_type"] == "command_result", answer
    assert (final["cancel"]["state"], final["cancel"]["level"]) == ("completed", 3), final
    assert code == 1, (code, out, err)
    assert "but level 3 had completed since" in said_line, said_line
    for name, request in (("root", str(request_id)), ("coordinator", sent["reply_to"])):
        rows = [r for r in ledger_rows(procs.ledger(name)) if r["message_id"] == request]
        ends = [(r["action"], r["outcome"]) for r in rows if r["action"] in ENDS]
        assert ends == [("canceling", "CANCELED"), ("completed", AFTER_CANCEL)], rows
    rows = ledger_rows(coordinator)
    passed_down = next(
        r["id"] for r in rows if r["action"] == "canceling" and r["message_id"] == sent["reply_to"]
    )
    late = [
        r
        for r in rows
        if r["reply_to"] == sent["message_id"]
        and r["message_type"] == "command_result"
        and r["action"] == "received"
    ]
    assert late, "the result that came after the cancel is not in the coordinator's ledger"
    assert late[0]["id"] > passed_down, late


async def test_a_result_that_comes_after_the_cancel_is_relayed_and_recorded_as_such(
    fleet: tuple[FleetProcesses, Path], capture: Any
) -> None:
    # A specialist's `grind` holds its event loop: the cancel that reaches it meanwhile is
    # read only after its result is claimed, so the result comes up after the levels above
    # passed their cancel down, and is the truth the operator is told.
    procs, events_file = fleet
    config = procs.operator_config
    await route_up(procs, "grind")
    code, out, err = await capture(
        "send", "--config", config, "grind", "n=2", "seconds=4", "--detach", "--json",
        "--timeout", "120",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    request_id = str(json.loads(out)["request_id"])
    await until(lambda: event_at(events_file, "grinding", 2), "the specialist to start", 30)
    code, out, err = await capture("cancel", request_id, "--wait", "1", "--config", config)
    assert (code, err) == (3, ""), (code, out, err)  # it grinds on: nothing confirmed yet
    assert "canceled" not in out, out
    answer = await until(
        lambda: answer_of(procs.ledger("root"), request_id), "the root's answer", 60
    )
    assert answer["message_type"] == "command_result", answer
    assert event_at(events_file, "ground", 2) is not None

    code, out, err = await capture("request", "show", request_id, "--json", "--config", config)
    assert (code, err) == (0, ""), err
    report = json.loads(out)
    assert levels(report) == ["completed"] * 3, report
    assert report["why"] == report["below"]["why"] == AFTER_CANCEL_WHY, report
    assert (report["cancel"]["state"], report["cancel"]["level"]) == ("completed", 3), report
    assert "but level 3 had completed since" in report["cancel"]["line"], report
    code, out, err = await capture("request", "show", request_id, "--config", config)
    assert AFTER_CANCEL_WHY in out, out
    # A cancel now: the root's report says it ended after its cancel, and the levels say
    # where it ran (exit 1: not canceled).
    code, out, err = await capture("cancel", request_id, "--config", config)
    assert (code, err) == (1, ""), (code, out, err)
    assert out.strip() == f"request {request_id}: {report['cancel']['line']}", out
    # Each level above recorded its cancel passed down, then the result after it.
    coordinator = procs.ledger("coordinator")
    sent = downstream_of_command(coordinator, "grind")
    assert sent is not None
    for name, request in (("root", request_id), ("coordinator", sent["reply_to"])):
        rows = [r for r in ledger_rows(procs.ledger(name)) if r["message_id"] == request]
        ends = [(r["action"], r["outcome"]) for r in rows if r["action"] in ENDS]
        assert ends == [("canceling", "CANCELED"), ("completed", AFTER_CANCEL)], rows


def downstream_of_command(path: Path, command: str) -> dict[str, Any] | None:
    """The coordinator's `sent` row of the request it delegated for a command, or None."""
    for row in ledger_rows(path):
        if (row["message_type"], row["action"]) != ("command_request", "sent"):
            continue
        if json.loads(row["details"] or "{}").get("command") == command:
            return row
    return None


async def test_a_deadline_ends_the_wait_for_a_frozen_level_and_never_says_canceled(
    fleet: tuple[FleetProcesses, Path],
) -> None:
    # The cancel passed down to a frozen level bounds nothing: the request's deadline does.
    # Each level above answers as a delegation that timed out does, and says no `canceled`.
    procs, _ = fleet
    frozen = [procs.agents[name] for name in PAIR]
    async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
        await wait_for_route(console, "analyze", timeout=60)
        for agent in frozen:
            agent.signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            answer = asked(console, "analyze", {"n": 3, "target": "late"}, DEADLINE)
            coordinator = procs.ledger("coordinator")
            sent = await until(lambda: downstream_of(coordinator, 3), "the coordinator to delegate")
            (tracked,) = [
                t for t in console.agent.tracker.pending() if t.message.type == MSG_COMMAND_REQUEST
            ]
            said = await console.agent.cancel(tracked.message_id, timeout=2)
            assert said["state"] == "canceling", said
            outcome = await asyncio.wait_for(answer, DEADLINE + 10)
            assert isinstance(outcome, CommandFailed), outcome
            assert outcome.code == ErrorCode.TIMEOUT, outcome
            assert "cancel" not in outcome.error.lower(), outcome
            assert time.monotonic() - began >= DEADLINE - 1
            # Every level gives up at the same deadline, each on its own clock: until a
            # level's end is recorded the report may name it ("its answer is on its way
            # up"). Once they are, the frozen level is the one that has not confirmed;
            # never is the request told canceled.
            told: list[tuple[str, int | None]] = []
            async with asyncio.timeout(30):
                while not told or told[-1] != ("canceling", 3):
                    report = await console.agent.request_status(tracked.message_id, timeout=5)
                    verdict = cancel_verdict(report, "root")
                    told.append((verdict.state, verdict.level))
                    assert verdict.state == "canceling", verdict
                    await asyncio.sleep(0.1)
        finally:
            for agent in frozen:
                agent.signal(signal.SIGCONT)
    for name, request in (("root", str(tracked.message_id)), ("coordinator", sent["reply_to"])):
        rows = [r for r in ledger_rows(procs.ledger(name)) if r["message_id"] == request]
        ends = [(r["action"], r["outcome"]) for r in rows if r["action"] in ENDS]
        assert ends[:2] == [("canceling", "CANCELED"), ("failed", AFTER_CANCEL)], rows
