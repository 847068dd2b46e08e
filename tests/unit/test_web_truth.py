"""The web console tells the truth (docs/web.md): a silent or lost broker link makes every
row unknown, resolved incidents outlive a restart, jobs are numbered with their decisions,
requests carry names and doors, and the send form's parameters are checked as the root
describes them. No broker: the state is fed messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.kits.webrows import ME, ROOT, ledger_row, post, sent
from vox_mqtt.console.commandform import command_specs, params_of_status, params_problem
from vox_mqtt.console.web_operator import inbox_rows, request_rows, timeline_rows
from vox_mqtt.console.web_state import WebState
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.transport.session import Inbound

OPERATOR = uuid4()


def status(agent: UUID, name: str, epoch: int = 1) -> Inbound:
    report = AgentStatus(
        name=name, status="ACTIVE", epoch=epoch, started_at=now_iso(), heartbeat_interval=1.0
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=OPERATOR, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=False)


SCHEMA = {
    "linger": {
        "doc": "wait, then answer",
        "schema": {
            "type": "object",
            "properties": {
                "seconds": {"type": "number", "description": "how long"},
                "why": {"type": ["string", "null"]},
                "count": {"type": "integer", "default": 1},
            },
            "required": ["seconds"],
        },
    },
    "odd": {"schema": "not a schema"},
}


class Clocks:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_700_000_000.0

    def step(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def state_with(clocks: Clocks, **extra: Any) -> WebState:
    return WebState(
        FleetObserver(),
        top=OPERATOR,
        top_name="operator",
        clock=lambda: clocks.mono,
        wall=lambda: clocks.wall,
        **extra,
    )


def test_a_link_that_brings_nothing_past_every_heartbeat_is_unknown_since_its_last_message() -> (
    None
):
    clocks = Clocks()
    state = state_with(clocks)
    state.link(True)
    a = uuid4()
    state.take(status(a, "alpha"))  # heartbeat_interval 1.0
    heard = clocks.wall
    state.flush()
    clocks.step(1.9)  # within the interval and the grace: still known
    assert state.flush() is None
    assert state.link_state() == (True, None)
    clocks.step(0.2)
    batch = state.flush()
    assert batch is not None
    assert (batch["connected"], batch["down_since"]) == (False, heard)
    assert state.snapshot()["connected"] is False
    clocks.step(5)
    state.take(status(a, "alpha", epoch=2))  # the link speaks again: known again
    batch = state.flush()
    assert batch is not None
    assert (batch["connected"], batch["down_since"]) == (True, None)


def test_a_dropped_link_is_down_since_it_dropped_and_up_again_after() -> None:
    clocks = Clocks()
    state = state_with(clocks)
    state.link(True)
    clocks.step(10)
    state.link(False)
    dropped = clocks.wall
    clocks.step(3)
    state.link(False)  # told again: still since the first time
    assert state.link_state() == (False, dropped)
    state.link(True)
    assert state.link_state() == (True, None)


def test_a_console_never_connected_knows_nothing_since_it_started() -> None:
    clocks = Clocks()
    state = state_with(clocks)
    started = clocks.wall
    clocks.step(30)
    state.link(False)
    assert state.link_state() == (False, started)


def test_nobody_heartbeating_is_no_silence() -> None:
    clocks = Clocks()
    state = state_with(clocks)
    state.link(True)
    clocks.step(3600)
    state.flush()
    assert state.link_state() == (True, None)


def test_resolved_incidents_outlive_a_restart_for_an_hour(tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "resolved.jsonl"
    root, child = uuid4(), uuid4()
    first = state_with(clocks, resolved_file=path)
    first.take(status(child, "child"))
    first.take(post(root, child))
    clocks.step(5)
    first.take(post(root, child, resolved=True))
    assert [r["subject_name"] for r in first.warroom()["resolved"]] == ["child"]
    path.write_text(path.read_text() + '{"torn', encoding="utf-8")  # a crash mid-write
    clocks.step(60)
    second = state_with(clocks, resolved_file=path)  # the console restarted: nobody named yet
    resolved = second.warroom()["resolved"]
    assert [(r["subject"], r["subject_name"]) for r in resolved] == [(str(child), "child")]
    clocks.step(3600)
    assert state_with(clocks, resolved_file=path).warroom()["resolved"] == []


def test_an_unwritable_resolved_file_keeps_them_in_memory(tmp_path: Path) -> None:
    clocks = Clocks()
    root, child = uuid4(), uuid4()
    state = state_with(clocks, resolved_file=tmp_path / "missing" / "resolved.jsonl")
    state.take(post(root, child))
    state.take(post(root, child, resolved=True))
    assert len(state.warroom()["resolved"]) == 1


def root_status(agent: UUID, params: dict[str, Any] | None) -> Inbound:
    extra = {} if params is None else {"params": params}
    report = AgentStatus(
        name="root",
        status="ACTIVE",
        epoch=1,
        started_at=now_iso(),
        heartbeat_interval=1.0,
        commands=["linger", "odd", "plain"],
        **extra,
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=OPERATOR, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=False)


def test_the_roots_status_gives_the_send_forms_parameters_when_it_carries_them() -> None:
    clocks = Clocks()
    state = state_with(clocks)
    root = uuid4()
    state.take(root_status(root, SCHEMA))
    assert state.root_of_top() == root  # its status reports to the top
    specs = state.command_specs(root, ["linger", "odd", "plain"])
    assert specs["linger"]["doc"] == "wait, then answer"
    assert specs["linger"]["fields"] == [
        {"name": "seconds", "type": "number", "required": True, "doc": "how long", "default": None},
        {"name": "why", "type": "string", "required": False, "doc": None, "default": None},
        {"name": "count", "type": "integer", "required": False, "doc": None, "default": 1},
    ]
    assert specs["odd"] == {"doc": None, "fields": []}  # an odd schema: no fields, no failure
    assert "plain" not in specs
    state.take(root_status(root, None))  # a status without them: raw JSON again
    assert state.command_specs(root, ["linger"]) == {}


def test_params_are_checked_required_then_typed() -> None:
    spec = command_specs(SCHEMA, ["linger"])["linger"]
    assert params_problem(spec, {}) == "seconds is required"
    assert params_problem(spec, {"seconds": "5"}) == "seconds must be a number"
    assert params_problem(spec, {"seconds": True}) == "seconds must be a number"
    assert params_problem(spec, {"seconds": 1.5, "count": 2.5}) == "count must be an integer"
    assert params_problem(spec, {"seconds": 1, "count": 2, "why": "x", "other": [1]}) is None
    assert params_problem(None, {"anything": object()}) is None


@pytest.mark.parametrize("payload", [b"", b"[]", b"{", b'{"details": {"params": [1]}}'])
def test_a_status_without_readable_params_gives_none(payload: bytes) -> None:
    assert params_of_status(payload) is None


def job(mid: str, *, overlaps: list[str] | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"end_time": "2999-01-01T00:00:00+00:00"}
    if overlaps is not None:
        details["overlaps_undecided"] = overlaps
    return {"message_id": mid, "type": "job_detected", "source": ROOT, "details": details}


def test_the_inbox_numbers_jobs_with_their_decision_or_what_they_overlap() -> None:
    one, two, three = (str(uuid4()) for _ in range(3))
    entries = [
        job(one),
        {"message_id": str(uuid4()), "type": "summary", "details": {}},
        job(two, overlaps=[one]),
        job(three, overlaps=[one, two]),
    ]
    decisions = [
        {
            "job": one,
            "verdict": "approve",
            "decided_at": "2026-01-01T10:00:00+00:00",
            "outcome": "booked",
        }
    ]
    rows, _ = inbox_rows(entries, None, {ROOT: "root"}, decisions=decisions)
    jobs = {r["job"]["number"]: r["job"] for r in rows if r["job"] is not None}
    assert sorted(jobs) == [1, 2, 3]
    assert jobs[1]["decision"]["word"] == "approved"
    assert jobs[1]["decision"]["outcome"] == "booked"
    assert jobs[3]["decision"] is None
    assert jobs[3]["overlaps"] == [
        {"number": 1, "state": "approved"},
        {"number": 2, "state": "undecided"},
    ]
    assert rows[0]["source_name"] == "root"
    assert all("overlaps_undecided" not in r["details"] for r in rows)  # numbers, not ids
    assert [r["job"] for r in rows if r["type"] == "summary"] == [None]


def test_requests_carry_names_and_the_door_they_came_through() -> None:
    request = sent(1, "linger")
    door = ledger_row(
        2,
        "via",
        None,
        event_type="door",
        message_id=None,
        source=ME,
        details={"request_id": request["message_id"], "command": "linger", "door": "web"},
    )
    answer = ledger_row(
        3,
        "received",
        "command_result",
        reply_to=request["message_id"],
        details={"handled_by": ROOT},
    )
    other = sent(4, "other", door="a2a")  # a request that says its door itself
    cancelled = ledger_row(
        5,
        "via",
        None,
        event_type="door",
        message_id=None,
        details={"request_id": request["message_id"], "door": "cli", "what": "cancel"},
    )
    names = {ROOT: "root", ME: "operator"}
    rows = request_rows([request, door, answer, other, cancelled], ME, 0.0, names)
    by = {r["command"]: r for r in rows}
    assert by["linger"]["door"] == "web"
    assert by["linger"]["target_name"] == "root"
    assert by["linger"]["handled_by_name"] == "root"
    assert by["other"]["door"] == "a2a"
    line = timeline_rows([{**answer, "actions": ["received"]}], names)[0]
    assert (line["source_name"], line["target_name"]) == ("root", "operator")
    assert line["note"]["handled_by"] == "root"
    assert json.loads(by["linger"]["params"]) == {"x": 1}
