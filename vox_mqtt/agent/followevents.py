"""A sent request's transitions as `follow()` tells them (agent/lifecycle.py, docs/messages.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID

from vox_mqtt.agent.tracking import SentState, TrackedRequest
from vox_mqtt.protocol.messages import ErrorCode

__all__ = ["FOLLOW_END", "Followers", "follow_event"]

# A sent request's states, as follow() names them.
FOLLOW_STATES: Final = {
    SentState.QUEUED: "sent",
    SentState.ACKNOWLEDGED: "acknowledged",
    SentState.COMPLETED: "completed",
    SentState.FAILED: "failed",
    SentState.EXPIRED: "expired",
}
FOLLOW_END: Final = frozenset({"completed", "failed", "canceled", "expired"})


def follow_event(tracked: TrackedRequest, state: SentState, at: float) -> dict[str, Any] | None:
    """A sent request's state as follow() tells it (dispatched is no transition of its own)."""
    name = FOLLOW_STATES.get(state)
    if name is None:
        return None
    details: dict[str, Any] = {}
    if state is SentState.FAILED or state is SentState.EXPIRED:
        details = {"code": tracked.error_code, "error": tracked.error}
        if tracked.error_code == ErrorCode.CANCELED:
            name = "canceled"
    elif state is SentState.COMPLETED and tracked.reply is not None:
        details = {"type": tracked.reply.type}
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return {"state": name, "at": when, "details": details}


class Followers:
    """Who follows each request this agent sent: each hears its transitions, to its end."""

    def __init__(self) -> None:
        self._queues: dict[UUID, list[asyncio.Queue[dict[str, Any]]]] = {}

    async def follow(self, tracked: TrackedRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield each transition of a tracked request: what happened before the call first."""
        request_id = tracked.message_id
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._queues.setdefault(request_id, []).append(queue)
        try:
            now_wall, now_mono = time.time(), time.monotonic()
            for state, at in list(tracked.history):
                event = follow_event(tracked, state, now_wall - (now_mono - at))
                if event is not None:
                    yield event
                    if event["state"] in FOLLOW_END:
                        return
            while True:
                event = await queue.get()
                yield event
                if event["state"] in FOLLOW_END:
                    return
        finally:
            queues = self._queues.get(request_id, [])
            if queue in queues:
                queues.remove(queue)
            if not queues:
                self._queues.pop(request_id, None)

    def moved(self, tracked: TrackedRequest, new: SentState) -> None:
        """A tracked request moved: its followers hear of it."""
        if tracked.message_id in self._queues:
            event = follow_event(tracked, new, time.time())
            if event is not None:
                self.tell(tracked.message_id, event)

    def tell(self, request_id: UUID, event: dict[str, Any]) -> None:
        """Tell every follower of a request one event."""
        for queue in self._queues.get(request_id, ()):
            queue.put_nowait(event)
