"""Answers need no acknowledgement: who re-sends until answered, and how long an answer is held.

docs/messages.md, "Answers need no acknowledgement"; the rules in vox_mqtt/agent/sendrules.py
and the decision about a duplicate's held answer in vox_mqtt/agent/inbound.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from vox_mqtt.agent.inbound import answered
from vox_mqtt.agent.plan import Answered
from vox_mqtt.agent.sendrules import (
    REPLAY_MARGIN,
    awaits_answer,
    delivered,
    held_for_replay_until,
)
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage, new_message

NOW = datetime.now(UTC).replace(microsecond=0)
MASTER, ME = uuid4(), uuid4()


def message(kind: str, **details: object) -> VOXMessage:
    if kind == MSG_COMMAND_REQUEST:
        details = {"command": "analyze", "params": {}, **details}
    if kind in (MSG_CANCEL_REQUEST, "message_acknowledged"):
        key = "request_id" if kind == MSG_CANCEL_REQUEST else "in_response_to"
        details = {key: str(uuid4())}
    return new_message(kind, source=MASTER, target=ME, details=details)


def test_a_command_is_re_sent_until_answered_not_only_until_acknowledged() -> None:
    request = message(MSG_COMMAND_REQUEST)
    assert awaits_answer(request)
    assert not delivered(request, acknowledged=True)  # its answer may still be lost
    assert not delivered(request, acknowledged=False)


@pytest.mark.parametrize("kind", ["job_done", MSG_CANCEL_REQUEST, "message_acknowledged"])
def test_any_other_message_is_re_sent_until_acknowledged(kind: str) -> None:
    other = message(kind)
    assert not awaits_answer(other)
    assert delivered(other, acknowledged=True)
    assert not delivered(other, acknowledged=False)


def test_an_answer_is_held_until_its_requests_deadline_and_a_margin() -> None:
    deadline = NOW + timedelta(seconds=90)
    request = message(MSG_COMMAND_REQUEST, deadline=deadline.isoformat())
    until = held_for_replay_until(request, 30.0, now=NOW.timestamp())
    assert until == deadline.timestamp() + REPLAY_MARGIN


def test_without_a_deadline_an_answer_is_held_for_the_levels_timeout_and_a_margin() -> None:
    request = message(MSG_COMMAND_REQUEST)
    until = held_for_replay_until(request, 30.0, now=NOW.timestamp())
    assert until == NOW.timestamp() + 30.0 + REPLAY_MARGIN


def test_a_duplicate_commands_answer_is_held_while_its_time_lasts() -> None:
    now = NOW.timestamp()
    assert answered(None, now) is Answered.NOT_YET  # nothing recorded: ack the copy again
    assert answered(now + 1, now) is Answered.HELD  # replay it
    assert answered(now, now) is Answered.HELD
    assert answered(now - 1, now) is Answered.GONE  # held long enough, not purged yet
