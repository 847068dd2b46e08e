"""A sent request's transitions as `follow()` tells them (agent/lifecycle.py, docs/messages.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from vox_mqtt.agent.tracking import RequestState, TrackedRequest
from vox_mqtt.protocol.messages import ErrorCode

__all__ = ["FOLLOW_END", "follow_event"]

# A sent request's states, as follow() names them.
FOLLOW_STATES: Final = {
    RequestState.QUEUED: "sent",
    RequestState.ACKNOWLEDGED: "acknowledged",
    RequestState.COMPLETED: "completed",
    RequestState.FAILED: "failed",
    RequestState.EXPIRED: "expired",
}
FOLLOW_END: Final = frozenset({"completed", "failed", "canceled", "expired"})


def follow_event(tracked: TrackedRequest, state: RequestState, at: float) -> dict[str, Any] | None:
    """A sent request's state as follow() tells it (dispatched is no transition of its own)."""
    name = FOLLOW_STATES.get(state)
    if name is None:
        return None
    details: dict[str, Any] = {}
    if state is RequestState.FAILED or state is RequestState.EXPIRED:
        details = {"code": tracked.error_code, "error": tracked.error}
        if tracked.error_code == ErrorCode.CANCELED:
            name = "canceled"
    elif state is RequestState.COMPLETED and tracked.reply is not None:
        details = {"type": tracked.reply.type}
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return {"state": name, "at": when, "details": details}
