"""What may be sent, and for how long: the size limit, a deadline, the replay window.

Pure rules the outbox applies before a publish and at each re-send (docs/messages.md,
docs/security.md); the liveness and war-room publishers check the size limit too.
"""

from __future__ import annotations

import time

from vox_mqtt.protocol.errors import MessageTooLarge
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_REQUEST,
    VOXMessage,
    expiry_seconds,
    parse_timestamp,
)
from vox_mqtt.protocol.signing import Signing, resend_until

__all__ = [
    "REPLAY_MARGIN",
    "awaits_answer",
    "check_size",
    "deadline_passed",
    "delivered",
    "expiry",
    "held_for_replay_until",
    "outlived",
    "request_time_left",
    "resend_deadline",
    "time_left",
]

# How long past its request's deadline an answer stays held for replay: the requester's last
# re-send may leave just before its deadline and arrive a moment later, or from a host whose
# clock runs a little behind (docs/ledger.md, "Answers held for replay").
REPLAY_MARGIN = 60.0


def awaits_answer(message: VOXMessage) -> bool:
    """Tell whether a sent message is re-sent until answered, not only until acknowledged.

    A command_request: its answer is never acknowledged, so the requester re-sends it until
    the answer comes or its deadline passes, and the answerer replays the answer it recorded
    (docs/messages.md, "Answers need no acknowledgement").
    """
    return message.type == MSG_COMMAND_REQUEST


def delivered(message: VOXMessage, *, acknowledged: bool) -> bool:
    """Tell whether a sent message needs no more re-sending: its ack came, and it awaits none.

    A command_request is re-sent until answered (or its deadline): its ack only says its
    peer holds it, and the answer, never acknowledged, may be lost on the way.
    """
    return acknowledged and not awaits_answer(message)


def held_for_replay_until(
    request: VOXMessage, default: float, *, now: float | None = None
) -> float:
    """Return until when (a Unix time) the answer to a received command is held for replay.

    Its requester re-sends the request at most until its deadline (now + default for one
    without): the answer is held that long, and REPLAY_MARGIN more.
    """
    return (
        (time.time() if now is None else now)
        + request_time_left(request, default, now=now)
        + REPLAY_MARGIN
    )


def check_size(message: VOXMessage, payload: bytes, limit: int) -> None:
    """Refuse a message over the size limit before it is recorded or published.

    The broker would drop the connection for an oversize packet, and every receiver would
    refuse it anyway (docs/messages.md): the caller answers with MESSAGE_TOO_LARGE instead.
    """
    if len(payload) > limit:
        raise MessageTooLarge(
            f"{message.type} would be {len(payload)} bytes, over the {limit}-byte message limit",
            size=len(payload),
            limit=limit,
        )


def deadline_passed(message: VOXMessage, *, now: float | None = None) -> bool:
    """Tell whether a command_request's deadline has passed (False without one)."""
    deadline = message.details.get("deadline")
    if message.type != MSG_COMMAND_REQUEST or not isinstance(deadline, str):
        return False
    return parse_timestamp(deadline).timestamp() <= (time.time() if now is None else now)


def time_left(deadline: str | None, default: float, *, now: float | None = None) -> float:
    """Return how long a level works on (or waits for) a request: until its deadline.

    The deadline is the caller's (docs/operations.md, "Deadlines are the caller's"): a
    level's own `request_timeout` (default) applies only to a request that carries none.
    A deadline already past leaves 0.
    """
    if deadline is None:
        return default
    left = parse_timestamp(deadline).timestamp() - (time.time() if now is None else now)
    return max(0.0, left)


def request_time_left(message: VOXMessage, default: float, *, now: float | None = None) -> float:
    """Return how long a sent command_request may wait unacknowledged or unanswered."""
    deadline = message.details.get("deadline")
    if message.type != MSG_COMMAND_REQUEST or not isinstance(deadline, str):
        return default
    return time_left(deadline, default, now=now)


def expiry(message: VOXMessage) -> int | None:
    """Return the MQTT expiry of a command_request with a deadline (it is useless after)."""
    deadline = message.details.get("deadline")
    if message.type != MSG_COMMAND_REQUEST or not isinstance(deadline, str):
        return None
    return expiry_seconds(deadline)


def resend_deadline(message: VOXMessage, signing: Signing | None) -> float | None:
    """Return when a signed message may no longer be sent (wall clock); None: unsigned.

    Its receiver refuses a signed message older than the replay window as STALE, so its
    sender ends it then, for good, with a ledger row (docs/security.md, replays).
    """
    if signing is None or not signing.signs:
        return None
    return resend_until(message.emitted_at, signing.replay_window)


def outlived(
    message: VOXMessage, signing: Signing | None, until: float | None = None
) -> str | None:
    """Return why a message may not be sent again (its age), or None."""
    until = resend_deadline(message, signing) if until is None else until
    if signing is None or until is None or time.time() < until:
        return None
    window = signing.replay_window
    return f"older than the replay window ({window:g} s): its receiver would refuse it STALE"
