"""A read-only view of the fleet: every status and war-room post one identity may read."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from uuid import UUID

from vox_mqtt.observe.status import FleetView, FleetWord
from vox_mqtt.observe.statusbounds import Timeliness
from vox_mqtt.observe.warroom import Incident, apply_warroom
from vox_mqtt.observe.warroomguard import WarroomGuard
from vox_mqtt.observe.warroomreplay import WarroomOrder
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import InvalidMessage, TopicError
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, VOXMessage, parse
from vox_mqtt.protocol.signing import Signing
from vox_mqtt.transport.session import Inbound

__all__ = ["FleetObserver", "expiry_left", "read_status"]

log = logging.getLogger("vox_mqtt.liveness")


def read_status(inbound: Inbound, topic: topics.StatusTopic) -> VOXMessage | None:
    """Return the agent_status message on a status topic, or None (cleared, bad, forged)."""
    if not inbound.payload:
        return None
    try:
        message = parse(inbound.payload)
    except InvalidMessage as exc:
        log.warning("bad status on %s: %s", inbound.topic, exc.reason)
        return None
    if message.source != topic.agent or message.type != MSG_AGENT_STATUS:
        log.warning("status on %s claims source %s", inbound.topic, message.source)
        return None
    return message


def expiry_left(inbound: Inbound, message: VOXMessage) -> float | None:
    """Return the message expiry the broker says is left on an INACTIVE status, else None.

    Only an INACTIVE's is read (a will's dates the loss by the broker's clock,
    docs/liveness.md): decoding every heartbeat's properties would cost for nothing.
    """
    if message.details.get("status") != "INACTIVE":
        return None
    left = inbound.properties.get("message_expiry_interval")
    return float(left) if isinstance(left, int) else None


def _unknown(_agent: UUID) -> UUID | None:
    return None


class FleetObserver:
    """A read-only view of what one identity may read: statuses and war-room posts."""

    def __init__(
        self,
        *,
        stale_after: float = 3.0,
        signing: Signing | None = None,
    ) -> None:
        self.view = FleetView(stale_after=stale_after)
        if signing is not None and signing.mode != "off":
            # Names and masters from the signed bundle, never a status's claim (F26), and
            # statuses dated by their signed emitted_at (F23): docs/security.md.
            roster = {
                agent: FleetWord(name=name, master=master)
                for agent, (name, master) in signing.roster.items()
            }
            self.view.fleet_word = roster.get
            owners = {w.name: agent for agent, w in roster.items() if w.name}
            self.view.named = owners.get
            self.view.timeliness = Timeliness(window=signing.replay_window, skew=signing.clock_skew)
        self.incidents: dict[tuple[UUID, UUID], Incident] = {}
        self.on_incident: Callable[[Incident], None] | None = None
        self.messages = 0  # status and war-room messages taken so far
        self.forged = 0  # refused: their signature did not verify
        # War-room posts not taken, by reason: STALE (refused) and NOT_NEWER (ignored).
        self.replays: Counter[str] = Counter()
        # The signers' replay window: every bundle carries the fleet's (docs/security.md).
        self._order = WarroomOrder()
        if signing is not None:
            self._order.window, self._order.skew = signing.replay_window, signing.clock_skew
        self._guard = WarroomGuard()

    def take(self, inbound: Inbound) -> None:
        """Apply one message of the observer's subscriptions."""
        if inbound.forgery is not None:  # refused by the session (docs/security.md)
            self.forged += 1
            return
        try:
            topic = topics.parse_topic(inbound.topic)
        except TopicError:
            return
        self.messages += 1
        if isinstance(topic, topics.WarroomTopic):
            # Size and rate only: a look shows rule-breaking posts, marked (docs/broker.md).
            if self._guard.refuse(topic.source, topic.subject, len(inbound.payload), _unknown):
                return
            incident = apply_warroom(self.incidents, inbound, topic, self._order)
            if isinstance(incident, str):  # a replay (docs/security.md): never shown
                self.replays[incident.partition(":")[0]] += 1
                log.info("war room: a post not taken: %s", incident)
            elif incident is not None and not incident.again and self.on_incident is not None:
                self.on_incident(incident)
        elif isinstance(topic, topics.StatusTopic):
            message = read_status(inbound, topic)
            if message is not None:
                self.view.update(
                    message,
                    retained=inbound.retain,
                    presence=topic.presence,
                    expiry_left=expiry_left(inbound, message),
                )
