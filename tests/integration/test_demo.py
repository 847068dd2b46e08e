"""`vox demo` end to end, as a user runs it: its narration and the ledgers it leaves behind."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kits.demokit import (
    REPO,
    alive,
    assert_nothing_left,
    demo_command,
    demo_env,
    demo_process,
    run_demo,
    started_pids,
)
from vox_mqtt.fleet.config import load_console_config
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.hierarchy import load_fleet
from vox_mqtt.protocol.signing import is_sealed, open_sealed

# A whole demo run is one bounded process (run_demo's timeout): on a loaded machine it takes
# longer than the suite's default per-test cap, so this module gets a cap of its own.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def rows(directory: Path, name: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(directory / "state" / name / "logs.db")
    try:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM logs ORDER BY id")]
    finally:
        db.close()


def one(found: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    hits = [r for r in found if all(r.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, hits)
    return hits[0]


def where(found: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in found if all(r.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Run `vox demo` once for the module's checks; return its folder and output."""
    directory = tmp_path_factory.mktemp("demo") / "demo-fleet"
    return directory, run_demo(directory, timeout=360)


def test_the_narration_shows_every_step(demo_run: tuple[Path, str]) -> None:
    directory, output = demo_run
    fleet = load_fleet(directory / "fleet.toml")
    steps = [
        "1. The fleet",
        "all 4 agents published ACTIVE",
        "the root advertises: analyze, financial_summary",
        "analyze: operator -> root -> coordinator -> specialist",
        '"kind": "file name (.pdf)"',
        "causality chain",
        "A job arrives by e-mail",
        "rejected intake file 3-broken.eml: Start: '",
        "has no timezone",
        "does not fit the allotted time",
        "operator inbox: 1 notification(s)",
        "Client: Netwire",
        "The human decides: three overlapping jobs",
        "overlapping 2 undecided job(s)",
        "job_detected #4 from root",
        "overlaps #2 (undecided), #3 (undecided)",
        "job #2 approved: booked: 180 min of work",
        "job #3 rejected: nothing booked",
        "job #3 was already rejected at",
        "(exit 2: a decision is final)",
        "does not fit the allotted time (120 min of work; 180 min allotted in the window, 135",
        "overlapping 0 undecided job(s)",
        "verdict=approve",
        "decision_recorded",
        "outcome=boo",  # the trace crops its lines at the terminal width
        "financial_summary: a data_request",
        '"value": 40',
        "specialist_b is killed with SIGKILL",
        "open incidents: 1",
        "CRITICAL VM_CONNECTION_LOST",
        "INACTIVE  ",  # vox status: the state cell, then its gap (its code when it fits)
        "specialist_b INACTIVE VM_CONNECTION_LOST",
        "specialist_b is ACTIVE again (epoch 2)",
        "Clean shutdown",
        "processes the demo started have exited",
    ]
    position = 0
    for step in steps:
        found = output.find(step, position)
        assert found >= 0, f"{step!r} missing after position {position}:\n{output}"
        position = found
    assert output.count("causality chain") == 4  # analyze: three hops; a decided job: one
    # Names, not UUIDs, in what it narrates: the handler, each hop of each trace.
    root, coordinator = fleet.agent("root"), fleet.agent("coordinator")
    assert "was answered by root," in output
    assert f"operator {str(fleet.operator_id)[:8]} → root {str(root.id)[:8]}" in output
    assert f"root {str(root.id)[:8]} → coordinator {str(coordinator.id)[:8]}" in output
    assert re.search(rf"coordinator {str(coordinator.id)[:8]} → specialist_[ab] ", output)
    assert re.search(r"down for \d+\.\ds", output)
    for agent in fleet:
        assert f"{agent.name}: stopped cleanly" in output
    assert "Traceback" not in output


def test_nothing_is_left_running(demo_run: tuple[Path, str]) -> None:
    directory, _ = demo_run
    assert_nothing_left(directory)
    assert json.loads((directory / "run.json").read_text())["demo_pid"] is None


def test_the_ledgers_hold_the_reply_to_chain_of_analyze(demo_run: tuple[Path, str]) -> None:
    directory, _ = demo_run
    fleet = load_fleet(directory / "fleet.toml")
    ids = {a.name: str(a.id) for a in fleet} | {"operator": str(fleet.operator_id)}
    root, coordinator = rows(directory, "root"), rows(directory, "coordinator")
    asked = one(
        [r for r in root if json.loads(r["details"]).get("command") == "analyze"],
        message_type="command_request",
        action="received",
        source=ids["operator"],
    )
    down = one(root, message_type="command_request", action="sent", reply_to=asked["message_id"])
    assert down["target"] == ids["coordinator"]
    one(root, message_type="command_result", action="sent", reply_to=asked["message_id"])
    # The root's ledger never names a specialist.
    specialists = {ids["specialist_a"], ids["specialist_b"]}
    assert not {r["source"] for r in root} & specialists
    assert not {r["target"] for r in root} & specialists
    # The coordinator took the root's request and delegated it with reply_to.
    one(
        coordinator,
        message_type="command_request",
        action="received",
        message_id=down["message_id"],
    )
    further = one(
        coordinator, message_type="command_request", action="sent", reply_to=down["message_id"]
    )
    specialist = next(n for n in ("specialist_a", "specialist_b") if ids[n] == further["target"])
    served = rows(directory, specialist)
    one(
        served, message_type="command_request", action="completed", message_id=further["message_id"]
    )
    result = one(served, message_type="command_result", action="sent")
    assert result["reply_to"] == further["message_id"]
    up = one(coordinator, message_type="command_result", action="sent", target=ids["root"])
    assert up["reply_to"] == down["message_id"]
    assert json.loads(up["details"])["handled_by"] == ids["coordinator"]


def test_the_job_went_specialist_coordinator_root_operator(demo_run: tuple[Path, str]) -> None:
    directory, _ = demo_run
    fleet = load_fleet(directory / "fleet.toml")
    ids = {a.name: str(a.id) for a in fleet} | {"operator": str(fleet.operator_id)}
    intake = directory / "state" / "specialist_a" / "intake"
    assert sorted(p.name for p in (intake / "processed").iterdir()) == [
        "1-netwire.eml",
        "2-weekend.eml",
        "4-atlas.eml",
        "5-borealis.eml",
        "6-cobalt.eml",
        "7-dune.eml",
        "8-ember.eml",
    ]
    assert sorted(p.name for p in (intake / "rejected").iterdir()) == [
        "3-broken.eml",
        "3-broken.eml.reason",
    ]
    assert "has no timezone" in (intake / "rejected" / "3-broken.eml.reason").read_text()
    specialist, coordinator = rows(directory, "specialist_a"), rows(directory, "coordinator")
    sent = where(specialist, message_type="job_detected", action="sent")
    received = where(coordinator, message_type="job_detected", action="received")
    # The broken file was never sent: seven files, seven messages, each received once.
    assert len(sent) == 7
    assert {r["message_id"] for r in received} == {r["message_id"] for r in sent}
    assert len(received) == 7
    assert {r["source"] for r in received} == {ids["specialist_a"]}
    assert len(where(coordinator, event_type="job", action="notified")) == 5
    assert len(where(coordinator, event_type="job", action="not_notified")) == 2
    forwarded = where(coordinator, message_type="job_detected", action="sent")[0]
    assert forwarded["target"] == ids["root"]
    root = rows(directory, "root")
    one(root, message_type="job_detected", action="received", message_id=forwarded["message_id"])
    notified = where(root, message_type="job_detected", action="sent", target=ids["operator"])[0]
    # The operator's console kept it, note_to_human and all, for `vox inbox`.
    inbox = [
        json.loads(line)
        for line in (directory / "state" / "operator" / "inbox.jsonl").read_text().splitlines()
    ]
    entry = inbox[0]
    assert len({e["message_id"] for e in inbox}) == 5
    assert entry["message_id"] == notified["message_id"]
    assert entry["message_source"] == "ana@netwire.example"
    # Kept sealed to the operator (docs/security.md); its key opens it, as `vox inbox` does.
    sealed = entry["details"]["note_to_human"]
    assert is_sealed(sealed)
    config = directory / "config" / "operator.toml"
    section = load_console_config(config).signing
    assert section is not None
    seal_key = section.signing(config.parent).seal_key
    assert seal_key is not None
    assert "Client: Netwire" in open_sealed(sealed, seal_key)
    # note_to_human is never in the coordinator's ledger, job book or reports.
    for path in (directory / "state" / "coordinator").rglob("*"):
        if path.is_file():
            assert b"Netwire" not in path.read_bytes(), path


def test_the_decisions_booked_exactly_the_approved_job(demo_run: tuple[Path, str]) -> None:
    directory, _ = demo_run
    state = directory / "state"
    book = json.loads((state / "coordinator" / "jobs.json").read_text())
    verdicts = {job["value"]: job["decision"] for job in book["jobs"]}
    # Atlas approved, Borealis rejected, Cobalt, Ember and the Netwire job undecided; Dune
    # (overlapping Atlas) was never notified.
    assert verdicts == {30: None, 40: "approve", 60: "reject", 25: None, 45: None}
    decided = [
        json.loads(line)
        for line in (state / "operator" / "decisions.jsonl").read_text().splitlines()
    ]
    assert [d["verdict"] for d in decided] == ["approve", "reject"]
    assert decided[0]["note"] == "Atlas: yes"
    coordinator, root = rows(directory, "coordinator"), rows(directory, "root")
    approved = one(coordinator, event_type="job", action="approved")
    one(coordinator, event_type="job", action="rejected")
    # The second decision on job #3 was refused by the console: no agent saw it.
    assert where(coordinator, event_type="decision", action="rejected") == []
    decision = one(coordinator, message_type="decision", action="received",
                   message_id=approved["message_id"])  # fmt: skip
    assert json.loads(decision["details"])["verdict"] == "approve"
    answers = where(root, message_type="decision_recorded", action="sent")
    assert [json.loads(a["details"])["verdict"] for a in answers] == ["approve", "reject"]
    # The coordinator's view of the root's fourth notification names its undecided overlaps.
    kept = [
        json.loads(line) for line in (state / "operator" / "inbox.jsonl").read_text().splitlines()
    ]
    cobalt = next(e for e in kept if e["details"]["price"]["value"] == 25)
    assert len(cobalt["details"]["overlaps_undecided"]) == 2


def test_the_financial_summary_and_the_war_room_are_in_the_ledgers(
    demo_run: tuple[Path, str],
) -> None:
    directory, _ = demo_run
    fleet = load_fleet(directory / "fleet.toml")
    ids = {a.name: str(a.id) for a in fleet}
    root, coordinator = rows(directory, "root"), rows(directory, "coordinator")
    request = one(root, message_type="data_request", action="sent", target=ids["coordinator"])
    response = one(root, message_type="data_response", action="received")
    assert response["reply_to"] == request["message_id"]
    assert json.loads(response["details"])["request_id"] == request["message_id"]
    one(coordinator, message_type="data_request", action="received")
    (report,) = (directory / "state" / "coordinator" / "reports").iterdir()
    assert report.name == f"financial_summary-{request['message_id']}.csv"
    assert len(report.read_text().splitlines()) == 2
    failures = where(coordinator, message_type="system_failure", action="sent")
    posted = [json.loads(r["details"]) for r in failures]
    assert [p["error_code"] for p in posted if not p["resolved"]] == ["VM_CONNECTION_LOST"]
    assert {p["subject"] for p in posted} == {ids["specialist_b"]}
    assert any(p["resolved"] for p in posted)


def test_every_ledger_verifies(demo_run: tuple[Path, str]) -> None:
    directory, _ = demo_run

    async def verify(path: Path) -> bool:
        async with VOXAgentMemory(path, read_only=True) as memory:
            return (await memory.verify()).ok

    ledgers = sorted((directory / "state").glob("*/logs.db"))
    assert len(ledgers) >= 5
    for path in ledgers:
        assert asyncio.run(verify(path)), path


def test_keep_running_waits_for_ctrl_c_and_then_stops_everything(tmp_path: Path) -> None:
    directory = tmp_path / "kept"
    lines: list[str] = []
    with demo_process(directory, "--keep-running") as process:
        assert process.stdout is not None
        deadline = time.monotonic() + 300
        for line in process.stdout:
            lines.append(line)
            if "Press Ctrl-C" in line or time.monotonic() > deadline:
                break
        output = "".join(lines)
        assert "Press Ctrl-C" in output, output
        port = json.loads((directory / "run.json").read_text())["port"]
        assert f"port {port}" in output
        assert "username " in output
        assert "vox status --config" in output
        # The broker and four daemons run (the killed specialist's first pid is gone).
        assert sum(alive(p) for p in started_pids(directory)) == 5
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    assert process.returncode == 130, rest
    assert "stopped cleanly" in rest
    assert_nothing_left(directory)


def test_sigterm_while_starting_stops_everything(tmp_path: Path) -> None:
    directory = tmp_path / "early"
    with demo_process(directory) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if "$ vox-agent --config" in line:
                break
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    assert process.returncode == 130, rest
    assert "interrupted" in rest
    assert_nothing_left(directory)


def test_a_folder_that_is_not_a_demo_is_refused(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    done = subprocess.run(
        demo_command(tmp_path),
        cwd=REPO,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "is not empty and not a vox demo folder" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
