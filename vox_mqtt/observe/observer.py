"""A read-only view of the fleet: every status and war-room post one identity may read."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from uuid import UUID

from vox_mqtt.observe.status import FleetView, FleetWord
from vox_mqtt.observe.statusintake import Refusal, StatusIntake
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.protocol.signing import Signing
from vox_mqtt.transport.session import Inbound

__all__ = ["FleetObserver"]

log = logging.getLogger("vox_mqtt.liveness")


def _said(refusal: Refusal) -> None:
    # A look shows what it may read and acts on nothing: a replay is counted, and told at
    # INFO only (a look's warnings go to its terminal).
    if refusal.kind == "replayed":
        log.info("war room: a post not taken: %s", refusal.problem)


class FleetObserver:
    """A read-only view of what one identity may read: statuses and war-room posts.

    It takes them through the one intake (statusintake.py) an agent's watch of its children
    takes them through too; a look knows no master, so war-room posts are checked for size
    and rate only (docs/broker.md), and a replayed post is counted, never shown.
    """

    def __init__(
        self,
        *,
        stale_after: float = 3.0,
        signing: Signing | None = None,
    ) -> None:
        self.view = FleetView(stale_after=stale_after)
        if signing is not None and signing.mode != "off":
            # Names and masters from the signed bundle, never a status's claim (F26):
            # docs/security.md. The intake dates statuses by their signed emitted_at (F23).
            roster = {
                agent: FleetWord(name=name, master=master)
                for agent, (name, master) in signing.roster.items()
            }
            self.view.fleet_word = roster.get
            owners = {w.name: agent for agent, w in roster.items() if w.name}
            self.view.named = owners.get
        self._intake = StatusIntake(self.view, signing=lambda: signing)
        self._intake.on_refused = _said

    @property
    def incidents(self) -> dict[tuple[UUID, UUID], Incident]:
        """Return the open war-room incidents, by (source, subject)."""
        return self._intake.incidents

    @property
    def on_incident(self) -> Callable[[Incident], None] | None:
        """Return whom each new post or resolution is told to."""
        return self._intake.on_incident

    @on_incident.setter
    def on_incident(self, hook: Callable[[Incident], None] | None) -> None:
        self._intake.on_incident = hook

    @property
    def messages(self) -> int:
        """Return how many status and war-room messages were taken so far."""
        return self._intake.messages

    @property
    def forged(self) -> int:
        """Return how many messages were refused: their signature did not verify."""
        return self._intake.forged

    @property
    def replays(self) -> Counter[str]:
        """Return the war-room posts not taken, by reason: STALE (refused), NOT_NEWER."""
        return self._intake.replays

    def take(self, inbound: Inbound) -> None:
        """Apply one message of the observer's subscriptions."""
        self._intake.take(inbound)
