"""A stuck request, found and cancelled from the operator's seat, on real daemons.

operator -> root -> coordinator -> specialist, each agent its own `vox-agent` process on one
real broker; the specialist's `stuck` handler runs until it is cancelled
(tests/kits/lifecyclekit.py). The operator works only with `vox`: `send --detach`,
`request show`, `cancel` (docs/operations.md, "Find and cancel a stuck command").
"""

from __future__ import annotations

import asyncio
import json
import re
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
    DAEMONS,
    agent_id,
    event_at,
    events,
    ledger_dump,
    ledger_rows,
    lifecycle_fleet,
    outbox_size,
    restart,
    route_up,
    until,
    witness,
    witnessed,
)
from tests.kits.promkit import run_exporter, sample

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("request-life")) as found:
        yield found


async def detach(capture: Any, procs: FleetProcesses, command: str, *params: str) -> UUID:
    """`vox send COMMAND PARAMS --detach`: the request's id once the root acknowledged it."""
    code, out, err = await capture(
        "send", "--config", procs.operator_config, command, *params, "--detach", "--json",
        "--timeout", "600",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    return UUID(json.loads(out)["request_id"])


def levels(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Return (state, since) of each level of a nested report, the root's first."""
    found = []
    part: Any = report
    while isinstance(part, dict):
        found.append((part["state"], part.get("since")))
        part = part.get("below")
    return found


def request_ids(path: Path, n: int) -> set[str]:
    """Return the ids a ledger knows run n's command_request by (received and sent on)."""
    ids = set()
    for row in ledger_rows(path):
        if row["message_type"] != "command_request" or row["message_id"] is None:
            continue
        details = json.loads(row["details"] or "{}")
        if isinstance(details, dict) and details.get("params", {}).get("n") == n:
            ids.add(row["message_id"])
    return ids


def canceled_in(path: Path, n: int) -> bool:
    """Return whether a ledger recorded run n's request as canceled."""
    ids = request_ids(path, n)
    return any(r["action"] == "canceled" and r["message_id"] in ids for r in ledger_rows(path))


def operator_ledger(procs: FleetProcesses) -> Path:
    return procs.root / "state" / "operator" / "logs.db"


async def show(capture: Any, procs: FleetProcesses, request_id: UUID) -> dict[str, Any]:
    code, out, err = await capture(
        "request", "show", str(request_id), "--json", "--config", procs.operator_config
    )
    assert (code, err) == (0, ""), err
    report: dict[str, Any] = json.loads(out)
    return report


async def test_request_show_nests_each_level_and_names_no_one_below_its_children(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "stuck")
    request_id = await detach(capture, procs, "stuck", "n=1")
    await until(lambda: event_at(events_file, "started", 1), "the handler to start")

    report = await show(capture, procs, request_id)
    found = levels(report)
    assert [state for state, _ in found] == ["delegated", "delegated", "working"], report
    assert all(since for _, since in found), report
    # The first digits of the id do, as with every id a view prints (README).
    code, out, err = await capture(
        "request", "show", str(request_id)[:8], "--config", procs.operator_config
    )
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[0] == f"request {request_id}"
    assert lines[1].startswith("root: delegated since "), out
    assert lines[2].strip().startswith("└ level 2: delegated since "), out
    assert lines[3].strip().startswith("└ level 3: working since "), out

    # Each level names only its own children: nothing the root received or recorded names
    # the specialist, and the specialist's ledger never names the root.
    specialist, root = agent_id(procs, "specialist"), agent_id(procs, "root")
    assert str(specialist) not in json.dumps(report)
    root_ledger = ledger_dump(procs.ledger("root"))
    assert str(specialist) not in root_ledger
    assert specialist.hex not in root_ledger
    specialist_ledger = ledger_dump(procs.ledger("specialist"))
    assert str(root) not in specialist_ledger
    assert root.hex not in specialist_ledger

    # The coordinator restarted mid-request answers from its ledger: the same report.
    restart(procs, "coordinator")
    again = await show(capture, procs, request_id)
    assert levels(again) == found, (report, again)

    code, out, err = await capture("cancel", str(request_id), "--config", procs.operator_config)
    assert code == 0, (out, err)


async def test_cancel_reaches_the_handler_every_ledger_and_the_operator_and_nothing_runs_again(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "stuck")
    request_id = await detach(capture, procs, "stuck", "n=2")
    await until(lambda: event_at(events_file, "started", 2), "the handler to start")

    asked = time.time()
    code, out, err = await capture(
        "cancel", str(request_id), "--reason", "stuck for good", "--config", procs.operator_config
    )
    assert (code, err) == (0, ""), err
    assert out.startswith(f"request {request_id}: canceled"), out
    seen = await until(lambda: event_at(events_file, "cancelled", 2), "the handler's cancel")
    assert seen - asked < 2.0, f"the handler saw the cancel {seen - asked:.2f}s after `vox cancel`"

    for name in DAEMONS:
        ledger = procs.ledger(name)
        await until(lambda: canceled_in(ledger, 2), f"{name}'s canceled row")  # noqa: B023
    # The operator's answer: CANCELED (it may come in after `vox cancel` left: a look fetches it).
    report = await show(capture, procs, request_id)
    assert report["state"] == "canceled", report

    def operator_answer() -> list[dict[str, Any]]:
        return [
            json.loads(r["details"])
            for r in ledger_rows(operator_ledger(procs))
            if r["reply_to"] == str(request_id) and r["message_type"] == "command_error"
        ]

    answers = await until(operator_answer, "the operator's CANCELED answer")
    assert {a.get("code") for a in answers} == {"CANCELED"}, answers

    # Every agent restarted: nothing is re-sent and nothing runs again.
    watch = witness(procs)
    try:
        await asyncio.sleep(0.5)  # the witness's SUBACK
        for name in DAEMONS:
            restart(procs, name, kill=False)
        await asyncio.sleep(3.0)  # re-sends come 0.3 s after a start, and again after that
        for kind in ("command_request", "cancel_request", "command_result", "command_error"):
            assert witnessed(watch, kind) == [], f"{kind} sent again after the restarts"
    finally:
        watch.close()
    started = [e for e in events(events_file) if e[:2] == ("started", 2)]
    assert len(started) == 1, f"run 2 started {len(started)} times"
    for name in DAEMONS:
        assert outbox_size(procs.ledger(name)) == 0, f"{name}'s outbox is not empty"


async def test_a_cancel_sent_to_a_frozen_specialist_is_delivered_once_it_thaws(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "stuck")
    request_id = await detach(capture, procs, "stuck", "n=3")
    await until(lambda: event_at(events_file, "started", 3), "the handler to start")
    specialist = procs.agents["specialist"]
    specialist.signal(signal.SIGSTOP)
    try:
        # The coordinator keeps the cancel in its outbox until the specialist acknowledges it;
        # meanwhile the operator hears `canceling`, never `canceled` (docs/messages.md).
        code, out, err = await capture(
            "cancel", str(request_id), "--wait", "5", "--config", procs.operator_config
        )
        assert code == 3, (code, out, err)
        assert "level 3 has not confirmed" in out, out
        assert "Traceback" not in err
        await asyncio.sleep(0.5)
        assert event_at(events_file, "cancelled", 3) is None  # frozen: it cannot have seen it
    finally:
        specialist.signal(signal.SIGCONT)
    thawed = time.time()
    seen = await until(lambda: event_at(events_file, "cancelled", 3), "the cancel after SIGCONT")
    assert seen - thawed < 5.0
    await until(lambda: canceled_in(procs.ledger("specialist"), 3), "the specialist's canceled row")


async def test_status_shows_in_flight_requests_and_the_exporter_counts_cancels(
    fleet: Fleet, capture: Any, tmp_path: Path
) -> None:
    procs, events_file = fleet
    await route_up(procs, "stuck")
    request_id = await detach(capture, procs, "stuck", "n=4")
    await until(lambda: event_at(events_file, "started", 4), "the handler to start")
    expected = {
        "root": {"received": 0, "working": 0, "delegated": 1},
        "coordinator": {"received": 0, "working": 0, "delegated": 1},
        "specialist": {"received": 0, "working": 1, "delegated": 0},
    }

    async def in_flight() -> dict[str, Any]:
        code, out, err = await capture("status", "--json", "--config", procs.operator_config)
        assert (code, err) == (0, ""), err
        return {row["name"]: row["in_flight"] for row in json.loads(out)["agents"]}

    deadline = time.monotonic() + 10  # the next heartbeat carries the gauges
    while (seen := await in_flight()) != expected:
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.5)
    code, out, err = await capture("status", "--config", procs.operator_config, "--wide")
    assert (code, err) == (0, ""), err
    assert "in flight" in out
    assert "1 working" in out
    assert "1 delegated" in out

    code, out, err = await capture("cancel", str(request_id), "--config", procs.operator_config)
    assert code == 0, (out, err)
    await until(lambda: event_at(events_file, "cancelled", 4), "the handler's cancel")
    with run_exporter(procs.operator_config, tmp_path / "exporter.log") as exporter:

        def counted() -> bool:
            samples = exporter.samples()
            return all(
                (sample(samples, "vox_agent_cancels_received_total", agent=name) or 0) >= 1
                and (
                    sample(samples, "vox_agent_requests_ended_total", agent=name, state="canceled")
                    or 0
                )
                >= 1
                and sample(samples, "vox_agent_requests_working", agent=name) == 0
                for name in DAEMONS
            )

        await until(counted, "the cancel counted by every agent", timeout=15)
        samples = exporter.samples()
        assert (sample(samples, "vox_agent_cancels_sent_total", agent="root") or 0) >= 1
        assert (sample(samples, "vox_agent_cancels_sent_total", agent="coordinator") or 0) >= 1


async def test_a_request_and_its_cancel_held_for_a_frozen_specialist_never_run_on(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "stuck")
    specialist = procs.agents["specialist"]
    specialist.signal(signal.SIGSTOP)  # before the request reaches it
    try:
        request_id = await detach(capture, procs, "stuck", "n=6")
        coordinator = procs.ledger("coordinator")
        await until(lambda: len(request_ids(coordinator, 6)) == 2, "the coordinator to delegate")
        code, out, err = await capture(
            "cancel", str(request_id), "--wait", "5", "--config", procs.operator_config
        )
        assert code == 3, (code, out, err)  # canceling: the frozen specialist cannot confirm
        assert "level 3 has not confirmed" in out, out
        assert "Traceback" not in err
        assert event_at(events_file, "started", 6) is None
    finally:
        specialist.signal(signal.SIGCONT)
    await until(lambda: canceled_in(procs.ledger("specialist"), 6), "the specialist's canceled row")
    await asyncio.sleep(1.0)
    # Both wait at the broker, the request first: it never starts, or it is cancelled at once.
    started = event_at(events_file, "started", 6)
    if started is not None:
        cancelled = await until(lambda: event_at(events_file, "cancelled", 6), "its cancel")
        assert cancelled - started < 2.0
    report = await show(capture, procs, request_id)
    assert [state for state, _ in levels(report)] == ["canceled"] * 3, report


async def test_detach_reports_a_refusal_at_once_with_its_code_and_what_to_do(
    fleet: Fleet, capture: Any
) -> None:
    procs, _ = fleet
    await route_up(procs, "stuck")
    # The root answers a command nobody serves with NO_ROUTE instead of an ack.
    for flags in ((), ("--json",)):
        started = time.monotonic()
        code, out, err = await capture(
            "send", "--config", procs.operator_config, "no_such_command", "--detach",
            "--timeout", "600", *flags,
        )  # fmt: skip
        took = time.monotonic() - started
        assert code == 1, (out, err)
        assert took < 5.0, f"the refusal took {took:.1f}s: it came at once"
        if flags:
            report = json.loads(out)
            assert (report["ok"], report["state"], report["code"]) == (False, "failed", "NO_ROUTE")
            assert "it serves: " in report["error"], report
            UUID(report["request_id"])
            continue
        assert out == "", out
        (line,) = err.splitlines()
        assert line.startswith("vox: error: no_such_command: NO_ROUTE: "), line
        # What to send instead, and that nothing was left running.
        assert re.search(r"it serves: .*\bstuck\b", line), line
        assert re.search(r"\(request [0-9a-f-]{36}: not running\)$", line), line
    # Accepted, it still returns promptly with the id.
    started = time.monotonic()
    request_id = await detach(capture, procs, "stuck", "n=7")
    assert time.monotonic() - started < 5.0
    code, out, err = await capture("cancel", str(request_id), "--config", procs.operator_config)
    assert code == 0, (out, err)
