"""This agent's FORGED_TRAFFIC incident: when to raise it, and when a reload explains it.

A message whose signature fails is refused, and the war room hears of it once per window
(docs/security.md, "Signatures"). One kind of refusal is no forgery: a peer's rotated key
that reached this agent before its reload (a rotation reloaded out of order, "Rotating a
key"). Once the reload shows that every refusal behind the incident was such a message (it
verifies under the new keys: `protocol/signing.carry_over`), the incident is resolved; a
refusal of any other kind, or from any other sender, keeps it open. Decisions only: the
agent raises and resolves (agent/facade.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from vox_mqtt.protocol.signing import UNKNOWN_KEY, incident_due, sender_of

__all__ = ["ForgedTraffic"]


class ForgedTraffic:
    """The refusals behind this agent's open FORGED_TRAFFIC incident, and when it was raised."""

    def __init__(self) -> None:
        self._raised_at: float | None = None
        self._refused: set[tuple[UUID | None, str]] = set()  # (sender, reason) since raised

    def refused(self, topic: str, problem: str, now: float) -> str | None:
        """A message on topic was refused for problem (its reason first): return the
        incident's text if it is to be raised now, None if one was raised in this window."""
        self._refused.add((sender_of(topic), problem.partition(":")[0]))
        if not incident_due(self._raised_at, now):
            return None
        self._raised_at = now
        return f"refused a message whose signature failed ({problem})"[:300]

    def explained(self, senders: Iterable[UUID]) -> bool:
        """A reload showed these senders' UNKNOWN_KEY refusals were a rotation: return True
        when that leaves no refusal behind the incident (resolve it now)."""
        if not self._refused:
            return False
        self._refused -= {(sender, UNKNOWN_KEY) for sender in senders}
        if self._refused:
            return False
        self._raised_at = None  # a forgery after this raises at once
        return True
