"""The agent's pure decisions, tested without a broker: verify() and choose_child()."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from vox_mqtt.agent.rules import choose_child, verify
from vox_mqtt.observe.status import ACTIVE, STALE, AgentLiveness
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, ErrorCode, VOXMessage, new_message
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
