"""What happens to the requests an agent sent or serves, as events on one queue.

The records' owners are the only writers of their state (docs/architecture.md): `Requests`
for a command this agent serves (its moves are `ServedMoved`, agent/requests.py),
`RequestTracker` for a message it sent (`SentMoved`, agent/tracking.py). Each move they
make is put on one `EventQueue`, in the order it happened, and the owner goes on: it calls
nobody. The union of what the queue carries is `requests.RequestEvent`. One
reader, the agent's `request-events` task (`VOXAgent._read_request_events`), takes them
in that order and hands each to who reads it: the progress reporter and the metrics
(a served command's moves), the followers of a sent request and the user's
`on_request_change` (a sent message's moves, and the progress its child reports).

The reader runs a turn of the loop after the move, never inside the writer's call: a
command already answered when its `working` move is read sends no progress (the answer
says the rest, agent/progress.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["EventQueue"]

E = TypeVar("E")


class EventQueue(Generic[E]):
    """A queue of events: any number of writers, one reader that takes them in order."""

    def __init__(self) -> None:
        self._queue: deque[E] = deque()
        self._ready = asyncio.Event()

    def put(self, event: E) -> None:
        """Add an event; never blocks, never calls anyone."""
        self._queue.append(event)
        self._ready.set()

    def take(self) -> list[E]:
        """Take every event waiting, oldest first (none: an empty list)."""
        taken = list(self._queue)
        self._queue.clear()
        self._ready.clear()
        return taken

    async def next_batch(self) -> list[E]:
        """Wait for at least one event; take every event waiting, oldest first."""
        while not self._queue:
            await self._ready.wait()
        return self.take()

    def __len__(self) -> int:
        return len(self._queue)
