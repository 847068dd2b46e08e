"""Cancels of requests not received (yet): remembered for a window, so such a request never starts.

agent/lifecycle.py keeps one; docs/ledger.md ("Canceled") says what a restart reads back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final
from uuid import UUID

__all__ = ["REMEMBERED_CANCELS", "REMEMBER_WINDOW", "RememberedCancels"]

# How many cancels of requests not yet received a restart remembers (the newest).
REMEMBERED_CANCELS: Final = 10_000
# How long such a cancel is remembered. It waits for a request that raced it (another
# intake worker, a restart between the two): over one session the request comes first,
# so ten minutes is long; what it costs is bounded (docs/security.md, "Costs of a peer's
# messages"): its sender's budget (agent/budget.py) times this window.
REMEMBER_WINDOW: Final = 600.0


class RememberedCancels:
    """Requests canceled before they came, oldest first, with when (time.monotonic())."""

    def __init__(self) -> None:
        self._at: dict[UUID, float] = {}

    def load(self, newest_first: Iterable[str]) -> None:
        """Remember the ids a restart read back, each from now (it may have raced its request)."""
        for text in reversed(list(newest_first)):
            try:
                self.remember(UUID(text))
            except ValueError:
                continue

    def remember(self, request_id: UUID) -> None:
        """Remember a request's cancel from now (a cancel again: remembered from now)."""
        now = time.monotonic()
        self._at.pop(request_id, None)
        self._at[request_id] = now
        self._forget(now)

    def drop(self, request_id: UUID) -> None:
        """Forget a cancel whose commit failed."""
        self._at.pop(request_id, None)

    def _forget(self, now: float) -> None:
        """Drop the cancels older than the window, and the oldest beyond the count."""
        remembered = self._at
        while remembered:
            oldest, at = next(iter(remembered.items()))
            if now - at <= REMEMBER_WINDOW and len(remembered) <= REMEMBERED_CANCELS:
                return
            del remembered[oldest]

    def __contains__(self, request_id: object) -> bool:
        at = self._at.get(request_id) if isinstance(request_id, UUID) else None
        return at is not None and time.monotonic() - at <= REMEMBER_WINDOW

    def __len__(self) -> int:
        self._forget(time.monotonic())
        return len(self._at)
