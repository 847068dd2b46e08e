"""Following a request and bad input, on real daemons (operator -> root -> coordinator ->
specialist, tests/kits/lifecyclekit.py): `vox send --follow` prints progress in order, the
bound on progress holds under a tight loop, a non-master's status query or cancel is
refused and recorded, an unknown or malformed id is one line, a flood of status queries
leaves the root serving, and no broker is one line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.kits.clikit import capture
from tests.kits.fleetproc import REPO, FleetProcesses, child_env
from tests.kits.lifecyclekit import (
    agent_id,
    event_at,
    ledger_rows,
    lifecycle_fleet,
    route_up,
    until,
    witness,
    witnessed,
)
from vox_mqtt.broker.local import free_port
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]
# The documented bound (docs/messages.md): at most one command_progress per 0.5 s per
# request and level, the newest kept; one more may open the window.
PROGRESS_EVERY = 0.5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("request-follow")) as found:
        yield found


def innermost(details: dict[str, Any]) -> dict[str, Any]:
    """Return the deepest level of a progress report (the handler's own words)."""
    while isinstance(details.get("below"), dict):
        details = details["below"]
    return details


async def test_progress_reaches_send_follow_in_order(fleet: Fleet, capture: Any) -> None:
    procs, _ = fleet
    await route_up(procs, "steps")
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "steps", "count=5", "pause=0.7",
        "--follow", "--json", "--timeout", "60",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    lines = [json.loads(line) for line in out.splitlines()]
    *transitions, answer = lines
    assert answer["ok"] is True
    assert answer["result"] == 5
    states = [t["state"] for t in transitions]
    assert states[0] == "sent", states
    assert states[-1] == "completed", states
    assert "acknowledged" in states
    assert "delegated" in states
    times = [t["at"] for t in transitions]
    assert times == sorted(times), times
    # Progress with the handler's words (a level also tells its state changes as progress).
    worded = [
        t for t in transitions if t["state"] == "progress" and "text" in innermost(t["details"])
    ]
    steps = [int(innermost(t["details"])["text"].split()[1]) for t in worded]
    # In order, each step at most once, and most of them (the last may be dropped before
    # the answer: docs/messages.md).
    assert steps == sorted(set(steps)), steps
    assert len(steps) >= 3, steps
    first = worded[0]["details"]
    assert first["state"] == "delegated"  # the root's part: it delegated
    assert first["below"]["state"] == "delegated"  # the coordinator's
    assert first["below"]["below"]["state"] == "working"  # the specialist's, three levels down
    specialist = str(agent_id(procs, "specialist"))
    assert specialist not in out

    # The same in text: one line per transition, its time and the time since it was sent.
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "steps", "count=3", "pause=0.7", "--follow"
    )
    assert (code, err) == (0, ""), err
    text = out.splitlines()
    assert re.fullmatch(r"request [0-9a-f-]{36}", text[0]), out
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} \+0\.000s sent", text[1]), out
    progress = r" progress delegated > delegated > working \d+% step \d$"
    assert any(re.search(progress, t) for t in text), out
    assert any(re.search(r" \+\d+\.\d{3}s completed$", t) for t in text), out


async def test_the_bound_on_progress_holds_under_a_tight_loop(fleet: Fleet, capture: Any) -> None:
    procs, _ = fleet
    await route_up(procs, "steps")
    ids = {
        name: agent_id(procs, name) for name in ("operator", "root", "coordinator", "specialist")
    }
    hops = {
        "specialist -> coordinator": topics.inbox(ids["coordinator"], ids["specialist"]),
        "coordinator -> root": topics.inbox(ids["root"], ids["coordinator"]),
        "root -> operator": topics.inbox(ids["operator"], ids["root"]),
    }
    seconds = 3.0
    watch = witness(procs)
    try:
        await asyncio.sleep(0.5)  # the witness's SUBACK
        started = time.monotonic()
        code, out, err = await capture(
            "send", "--config", procs.operator_config, "spin", f"seconds={seconds}",
            "--follow", "--json", "--timeout", "60",
        )  # fmt: skip
        took = time.monotonic() - started
        await asyncio.sleep(0.5)
        assert (code, err) == (0, ""), err
        made = json.loads(out.splitlines()[-1])["result"]
        assert made > 100, f"the handler reported only {made} times: not a tight loop"
        bound = took / PROGRESS_EVERY + 2
        seen = witnessed(watch, "command_progress")
        for hop, topic in hops.items():
            sent = [m for t, m in seen if t == topic]
            assert 1 <= len(sent) <= bound, f"{hop}: {len(sent)} progress messages in {took:.1f}s"
    finally:
        watch.close()


async def test_a_non_master_s_status_query_and_cancel_are_refused_and_recorded(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "steps")
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "stuck", "n=5", "--detach", "--json",
        "--timeout", "600",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    request_id = UUID(json.loads(out)["request_id"])
    await until(lambda: event_at(events_file, "started", 5), "the handler to start")
    coordinator = procs.ledger("coordinator")
    (held,) = [
        r["message_id"]
        for r in ledger_rows(coordinator)
        if r["action"] == "received"
        and r["message_type"] == "command_request"
        and json.loads(r["details"]).get("params", {}).get("n") == 5
    ]
    # The specialist is the coordinator's child, not its master: it may not ask or cancel.
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "probe_master", f"request_id={held}"
    )
    assert (code, err) == (0, ""), err

    def refused() -> dict[str, str]:
        return {
            r["message_type"]: r["reason"]
            for r in ledger_rows(coordinator)
            if r["action"] == "rejected" and r["message_type"] in ("status_query", "cancel_request")
        }

    reasons = await until(lambda: len(refused()) == 2 and refused(), "both refusals recorded")
    assert all(reasons.values()), reasons
    await asyncio.sleep(1.0)
    assert event_at(events_file, "cancelled", 5) is None  # the refused cancel stopped nothing
    code, out, err = await capture("cancel", str(request_id), "--config", procs.operator_config)
    assert code == 0, (out, err)


async def test_unknown_and_malformed_ids_are_one_line(fleet: Fleet, capture: Any) -> None:
    procs, _ = fleet
    await route_up(procs, "steps")
    nobody = uuid4()
    for verb in (("request", "show"), ("cancel",)):
        code, out, err = await capture(*verb, str(nobody), "--config", procs.operator_config)
        assert (code, out) == (2, ""), (verb, out, err)
        assert err.count("\n") == 1, err
        assert err.startswith(f"vox: error: request {nobody}: unknown to the root (root)"), err
        code, out, err = await capture(*verb, "not-an-id", "--config", procs.operator_config)
        assert (code, out) == (2, ""), (verb, out, err)
        assert err == "vox: error: not a request id (a UUID or the start of one): 'not-an-id'\n"
        # A prefix this console never sent is one line too (it never reaches the broker).
        code, out, err = await capture(*verb, "ffff0000", "--config", procs.operator_config)
        assert (code, out) == (2, ""), (verb, out, err)
        assert err == (
            "vox: error: no request id starting with 'ffff0000' in the requests this console sent\n"
        )


async def test_a_flood_of_status_queries_leaves_the_root_serving(fleet: Fleet) -> None:
    procs, _ = fleet
    await route_up(procs, "steps")
    async with OperatorConsole(procs.operator_config) as console:
        asked = [uuid4() for _ in range(300)]
        outcomes = await asyncio.gather(
            *(console.request_status(r, wait=20) for r in asked), return_exceptions=True
        )
        busy = [o for o in outcomes if isinstance(o, CommandFailed)]
        others = [o for o in outcomes if isinstance(o, BaseException) and o not in busy]
        assert others == [], others[:3]
        assert {e.code for e in busy} <= {"BUSY"}, {e.code for e in busy}
        answered = [o for o in outcomes if isinstance(o, dict)]
        assert answered, "no query answered at all"
        assert all(o["state"] == "unknown" for o in answered)
        # Still serving: a command down the tree and one more query, each in time.
        reply = await console.send_command("echo", {"text": "after"}, wait=20)
        assert reply.details["result"] == "after"
        assert (await console.request_status(uuid4(), wait=10))["state"] == "unknown"
    assert procs.agents["root"].process is not None
    assert procs.agents["root"].process.poll() is None


async def test_no_broker_is_one_line(fleet: Fleet, capture: Any) -> None:
    procs, _ = fleet
    config = procs.operator_config
    elsewhere = config.with_name("operator-nobroker.toml")
    # Nothing listens there; the console that would go through it gives up after 1 s.
    text = re.sub(
        r"(?m)^port = \d+$", f"port = {free_port()}\nconnect_timeout = 1", config.read_text()
    )
    elsewhere.write_text(text)
    for verb in (("request", "show"), ("cancel",)):
        code, out, err = await capture(*verb, str(uuid4()), "--config", elsewhere)
        assert (code, out) == (1, ""), (verb, out, err)
        errors = [line for line in err.splitlines() if line.startswith("vox: error: ")]
        assert len(errors) == 1, err
        assert "cannot reach the broker" in errors[0], err
        assert "Traceback" not in err


def _follow_process(procs: FleetProcesses, n: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vox_mqtt.cli", "send", "--config", str(procs.operator_config),
         "stuck", f"n={n}", "--follow", "--timeout", "600", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=child_env(), cwd=REPO,
    )  # fmt: skip


async def _interrupt_once_working(
    process: subprocess.Popen[str], events_file: Path, n: int
) -> None:
    try:
        await until(lambda: event_at(events_file, "started", n), "the handler to start", 30)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        await asyncio.to_thread(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_ctrl_c_during_follow_cancels_or_leaves_the_request_running(
    fleet: Fleet, capture: Any
) -> None:
    procs, events_file = fleet
    await route_up(procs, "steps")
    # --cancel-on-interrupt: Ctrl-C cancels, and the answer CANCELED is the last word.
    process = _follow_process(procs, 8, "--cancel-on-interrupt")
    await _interrupt_once_working(process, events_file, 8)
    out, err = process.communicate()
    assert process.returncode == 1, (out, err)
    assert "cancel: canceled" in out, out
    assert re.search(r" canceled CANCELED: ", out), out
    assert err.strip().splitlines()[-1].startswith("vox: error: stuck: CANCELED: "), err
    assert "Traceback" not in err
    await until(lambda: event_at(events_file, "cancelled", 8), "the handler's cancel")

    # No terminal to ask on: nothing is cancelled, and the way back to it is printed.
    process = _follow_process(procs, 9)
    await _interrupt_once_working(process, events_file, 9)
    out, err = process.communicate()
    assert process.returncode == 130, (out, err)
    request_id = out.splitlines()[0].removeprefix("request ")
    assert err == (
        f"vox: error: request {request_id} left running: `vox request show {request_id}`, "
        f"`vox cancel {request_id}`\n"
    )
    await asyncio.sleep(1.0)
    assert event_at(events_file, "cancelled", 9) is None
    code, out, err = await capture("cancel", request_id, "--config", procs.operator_config)
    assert code == 0, (out, err)
    await until(lambda: event_at(events_file, "cancelled", 9), "the handler's cancel")
