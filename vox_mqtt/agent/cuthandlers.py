"""Handlers a cancel cut that have not ended yet: their requests are `canceling` here.

A cancelled asyncio task may run on (a handler that catches CancelledError, or cleans up
slowly): until it ends, the level that cut it does not say `canceled` (docs/messages.md,
"A cancel tells the truth"). agent/lifecycle.py keeps one; in memory only, since a restart
ends every handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

__all__ = ["CutHandlers"]


class CutHandlers:
    """The tasks still running of each request a cancel cut, by request id."""

    def __init__(self) -> None:
        self._running: dict[UUID, set[asyncio.Task[Any]]] = {}

    def watch(self, request_id: UUID, tasks: Iterable[asyncio.Task[Any] | None]) -> None:
        """Keep the tasks a cancel cut (its handler's, an idempotent one started early)."""
        running = {task for task in tasks if task is not None and not task.done()}
        if not running:
            return
        self._running.setdefault(request_id, set()).update(running)
        for task in running:
            task.add_done_callback(lambda ended: self._ended(request_id, ended))

    def _ended(self, request_id: UUID, task: asyncio.Task[Any]) -> None:
        left = self._running.get(request_id)
        if left is None:
            return
        left.discard(task)
        if not left:
            del self._running[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._running

    async def ended(self, request_id: UUID, timeout: float) -> bool:
        """Wait up to timeout for every cut task of a request to end; False: one runs on."""
        left = self._running.get(request_id)
        if not left:
            return True
        _, pending = await asyncio.wait(set(left), timeout=timeout)
        return not pending

    def then(self, request_id: UUID, act: Callable[[], object]) -> None:
        """Do `act` once every cut task of a request ended: at once when none runs.

        A canceled request's CANCELED answer leaves then, never while its handler runs on.
        """
        pending = set(self._running.get(request_id, ()))
        if not pending:
            act()
            return

        def one_ended(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            if not pending:
                act()

        for task in list(pending):
            task.add_done_callback(one_ended)
