"""A sent request's transitions as `follow()` tells them (agent/lifecycle.py, docs/messages.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final

from vox_mqtt.agent.tracking import Follower, RequestTracker, SentState, TrackedRequest
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
    """What each request this agent sent tells its followers: its transitions, to its end.

    The followers hang on the request (`TrackedRequest.followers`). A move reaches them as
    an event read a turn after it happened (agent/requestevents.py): a follower that came
    in between has it from the history already, and skips it. The tracker, their owner,
    hangs them on and takes them off.
    """

    def __init__(self, tracker: RequestTracker) -> None:
        self._tracker = tracker

    async def follow(self, tracked: TrackedRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield each transition of a tracked request: what happened before the call first."""
        history = list(tracked.history)  # with no await between: nothing is missed nor told twice
        me = Follower(asyncio.Queue(), replayed=len(history))
        self._tracker.follow(tracked, me)
        try:
            now_wall, now_mono = time.time(), time.monotonic()
            for state, at in history:
                event = follow_event(tracked, state, now_wall - (now_mono - at))
                if event is not None:
                    yield event
                    if event["state"] in FOLLOW_END:
                        return
            while True:
                event = await me.queue.get()
                yield event
                if event["state"] in FOLLOW_END:
                    return
        finally:
            self._tracker.unfollow(tracked, me)

    def moved(self, tracked: TrackedRequest, new: SentState, at: float, step: int) -> None:
        """A tracked request moved (the `step`th move of its history): its followers hear of it."""
        if not tracked.followers:
            return
        event = follow_event(tracked, new, at)
        if event is None:
            return
        for follower in tracked.followers:
            if step >= follower.replayed:
                follower.queue.put_nowait(event)

    def tell(self, tracked: TrackedRequest, event: dict[str, Any]) -> None:
        """Tell every follower of a request one event."""
        for follower in tracked.followers:
            follower.queue.put_nowait(event)
