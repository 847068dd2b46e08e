"""A delivery being re-sent, and the peers not heard from (docs/security.md, F25).

A peer's broker session keeps what was sent while it is away, and Mosquitto drops what its
queue cannot take (docs/broker.md, `max_queued_messages`): re-sending into that queue only
fills it. So while a peer has not been heard from, each delivery to it is re-sent at most
QUIET_RESENDS times, and beyond `quiet_publishes` publishes to it only answers go. Hearing
from the peer (any message of its, an acknowledgement included) tries every delivery held
back at once. A held delivery still ends at its time, as any does (agent/deliveries.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final
from uuid import UUID

__all__ = ["QUIET_RESENDS", "Quiet", "QuietPeers"]

QUIET_RESENDS: Final = 2


@dataclass
class Quiet:
    """One delivery's count of re-sends since its peer was last heard from."""

    mark: int = 0  # how often its peer had been heard from when last counted
    resends: int = 0


class QuietPeers:
    """Publishes to each peer since it was last heard from, and the deliveries held back."""

    def __init__(self) -> None:
        self._unheard: Counter[UUID] = Counter()  # publishes since the peer was heard
        self._heard: Counter[UUID] = Counter()  # how often each peer was heard from
        self._held: dict[UUID, set[UUID]] = {}  # peer -> deliveries held back

    def new(self, peer: UUID) -> Quiet:
        """Return the count of a new delivery to a peer."""
        return Quiet(mark=self._heard[peer])

    def holds(
        self, peer: UUID, key: UUID, quiet: Quiet, *, answer: bool, resend: bool, limit: int
    ) -> bool:
        """Tell whether to hold a delivery back now (and remember it to try when heard from)."""
        if self._heard[peer] != quiet.mark:
            quiet.mark, quiet.resends = self._heard[peer], 0
        crowded = not answer and self._unheard[peer] >= limit
        if not (crowded or (resend and quiet.resends >= QUIET_RESENDS)):
            return False
        self._held.setdefault(peer, set()).add(key)
        return True

    def published(self, peer: UUID, quiet: Quiet, *, resend: bool) -> None:
        """Count one publish to a peer."""
        self._unheard[peer] += 1
        if resend:
            quiet.resends += 1

    def heard(self, peer: UUID) -> set[UUID]:
        """A message came from a peer; return the deliveries held back for it."""
        self._heard[peer] += 1
        self._unheard.pop(peer, None)
        return self._held.pop(peer, set())
