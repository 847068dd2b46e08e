"""The agent's pure decisions, tested without a broker: verify() and choose_child()."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from vox_mqtt.agent.rules import (
    choose_child,
    down_commands,
    down_levels,
    inactive_reason,
    verify,
)
from vox_mqtt.observe.status import ACTIVE, INACTIVE, RETIRED, STALE, AgentLiveness, FleetView
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    MSG_COMMAND_REQUEST,
    AgentStatus,
    ErrorCode,
    VOXMessage,
    new_message,
)
from vox_mqtt.protocol.topics import InboxTopic

ME, MASTER, CHILD, STRANGER = uuid4(), uuid4(), uuid4(), uuid4()
EVENT = "heads_up"  # an event type the contract does not know: accepted as it is
PEERS = frozenset({MASTER, CHILD})


def check(message: VOXMessage, topic: InboxTopic) -> str | None:
    return verify(message, topic, me=ME, master_id=MASTER, peers=PEERS)


def msg(kind: str, source: UUID, target: UUID = ME) -> VOXMessage:
    details = {"command": "x"} if kind == MSG_COMMAND_REQUEST else {}
    return new_message(kind, source=source, target=target, details=details)


def test_verify_accepts_a_command_from_the_master_and_an_event_from_a_child() -> None:
    assert check(msg(MSG_COMMAND_REQUEST, MASTER), InboxTopic(ME, MASTER)) is None
    assert check(msg(EVENT, CHILD), InboxTopic(ME, CHILD)) is None


@pytest.mark.parametrize(
    ("message", "topic", "why"),
    [
        (msg(EVENT, CHILD), InboxTopic(STRANGER, CHILD), "another agent's inbox"),
        (msg(EVENT, MASTER), InboxTopic(ME, CHILD), "does not match the sender"),
        (msg(EVENT, CHILD, STRANGER), InboxTopic(ME, CHILD), "is not this agent"),
        (msg(EVENT, STRANGER), InboxTopic(ME, STRANGER), "neither this agent's"),
        (msg(MSG_COMMAND_REQUEST, CHILD), InboxTopic(ME, CHILD), "commands come only from"),
    ],
)
def test_verify_names_why_a_message_is_refused(
    message: VOXMessage, topic: InboxTopic, why: str
) -> None:
    problem = check(message, topic)
    assert problem is not None
    assert why in problem


def child(status: str, *commands: str) -> AgentLiveness:
    return AgentLiveness(id=uuid4(), status=status, commands=commands)


def test_choose_child_prefers_healthy_then_least_loaded() -> None:
    busy, idle, stale = child(ACTIVE, "analyze"), child(ACTIVE, "analyze"), child(STALE, "analyze")
    picked = choose_child("analyze", [busy, idle, stale, None], load={busy.id: 3})
    assert picked == (idle.id, None)
    # Equal load: the tie-breaker decides, never a stale child.
    ties = {choose_child("analyze", [busy, idle, stale], load={})[0] for _ in range(50)}
    assert ties == {busy.id, idle.id}


def test_choose_child_names_target_inactive_and_no_route() -> None:
    assert choose_child("analyze", [child(STALE, "analyze")], load={}) == (
        None,
        ErrorCode.TARGET_INACTIVE,
    )
    assert choose_child("analyze", [child(ACTIVE, "echo"), None], load={}) == (
        None,
        ErrorCode.NO_ROUTE,
    )


# --- offline targets (REQ-001-US-002-008): TARGET_INACTIVE naming the level -----------------


def dead(*commands: str, code: str | None = None) -> AgentLiveness:
    """A child whose will came: it lists nothing now, its last ACTIVE status listed these."""
    return AgentLiveness(
        id=uuid4(), name="spec", status=INACTIVE, advertised=commands, error_code=code
    )


def test_children_that_died_are_target_inactive_among_this_masters_children() -> None:
    # Both analysts SIGKILLed: INACTIVE children list no commands, yet they served it.
    a, b = dead("analyze"), dead("analyze")
    assert choose_child("analyze", [a, b], load={}) == (None, ErrorCode.TARGET_INACTIVE)
    assert down_levels("analyze", [a, b]) == [None]
    assert inactive_reason("analyze", "coordinator", [None]) == (
        "every agent that serves 'analyze' among coordinator's children is down (INACTIVE or STALE)"
    )
    # A command they never served stays a typo.
    assert choose_child("analyse", [a, b], load={}) == (None, ErrorCode.NO_ROUTE)


def test_a_healthy_child_that_reports_it_down_names_its_level() -> None:
    coordinator = AgentLiveness(
        id=uuid4(), name="coordinator", status=ACTIVE, commands=(), commands_down=("analyze",)
    )
    assert choose_child("analyze", [coordinator], load={}) == (None, ErrorCode.TARGET_INACTIVE)
    assert down_levels("analyze", [coordinator]) == [coordinator]
    assert inactive_reason("analyze", "root", [coordinator]) == (
        "every agent that serves 'analyze' below coordinator is down (INACTIVE or STALE)"
    )
    # Another child that serves it now wins: a down branch never hides a live one.
    live = child(ACTIVE, "analyze")
    assert choose_child("analyze", [coordinator, live], load={}) == (live.id, None)


def test_a_retired_child_is_gone_not_down() -> None:
    retired = dead("analyze", code=RETIRED)
    assert choose_child("analyze", [retired], load={}) == (None, ErrorCode.NO_ROUTE)
    assert down_commands([retired], serving=(), limit=10) == []


def test_a_master_reports_down_what_only_down_agents_below_it_served() -> None:
    up = AgentLiveness(
        id=uuid4(), status=ACTIVE, commands=("echo",), advertised=("echo",), commands_down=("x",)
    )
    stale = AgentLiveness(id=uuid4(), status=STALE, commands=("analyze",), advertised=("analyze",))
    assert down_commands([up, stale, dead("scan"), None], serving=["echo"], limit=10) == [
        "analyze",
        "scan",
        "x",
    ]
    # What it serves through another child is not down; the list is bounded.
    assert down_commands([stale, dead("scan")], serving=["analyze"], limit=10) == ["scan"]
    assert down_commands([dead("a", "b", "c")], serving=(), limit=2) == ["a", "b"]


def test_the_fleet_view_keeps_a_childs_commands_down_while_it_is_down_cut_to_its_share() -> None:
    me, coordinator = uuid4(), uuid4()
    view = FleetView()
    view.share_of = lambda _agent: 2

    def report(state: str, down: list[str]) -> VOXMessage:
        details = AgentStatus(
            name="coordinator",
            status=state,
            epoch=1,
            started_at="2026-01-01T00:00:00+00:00",
            heartbeat_interval=1.0,
            commands_down=down,
        )
        return new_message(MSG_AGENT_STATUS, source=coordinator, target=me, details=details)

    view.update(report(ACTIVE, ["analyze", "scan", "tag"]))
    entry = view.get(coordinator)
    assert entry is not None
    # Only which error code a command gets hangs on it: cut, never a reason to refuse.
    assert entry.commands_down == ("analyze", "scan")
    assert entry.healthy
    view.update(report(INACTIVE, []))
    assert entry.commands_down == ("analyze", "scan")
    assert choose_child("analyze", [entry], load={}) == (None, ErrorCode.TARGET_INACTIVE)


def test_the_fleet_view_takes_commands_down_from_a_running_agents_status_without_a_state() -> None:
    # A running agent's full status carries no state word: the presence tells its state,
    # the status its commands and what is down below it (docs/liveness.md, "Which topic tells").
    me, coordinator = uuid4(), uuid4()
    view = FleetView()

    def report(state: str | None, down: list[str], *, target: UUID, sequence: int) -> VOXMessage:
        details = AgentStatus(
            name="coordinator",
            status=state,
            epoch=1,
            started_at="2026-01-01T00:00:00+00:00",
            heartbeat_interval=1.0,
            commands_down=down,
            sequence=sequence,
        )
        return new_message(MSG_AGENT_STATUS, source=coordinator, target=target, details=details)

    view.update(report(ACTIVE, [], target=coordinator, sequence=1), presence=True)
    view.update(report(None, ["analyze"], target=me, sequence=2))
    entry = view.get(coordinator)
    assert entry is not None
    assert entry.healthy
    assert entry.commands_down == ("analyze",)
    assert choose_child("analyze", [entry], load={}) == (None, ErrorCode.TARGET_INACTIVE)
    # Its children back: the next status lists nothing down.
    view.update(report(None, [], target=me, sequence=3))
    assert entry.commands_down == ()
    assert choose_child("analyze", [entry], load={}) == (None, ErrorCode.NO_ROUTE)
