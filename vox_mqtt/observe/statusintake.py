"""The one intake of status and war-room messages, for an agent and a look alike.

What a delivery on a status, presence or war-room topic does to a reader's `FleetView` and
its war room: a forged one is refused at the door (docs/security.md, signatures); a post is
checked for size, rule and rate (`warroomguard.py`), then for replays (`warroomreplay.py`);
a status is read (`read_status`) and taken into the view with the expiry the broker says is
left on a will (`expiry_left`, docs/liveness.md). The read-only `FleetObserver`
(observer.py) and an agent's watch of its children (agent/childwatch.py) both take through
it: the rules are written once, here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from vox_mqtt.observe.status import FleetView
from vox_mqtt.observe.statusbounds import Timeliness
from vox_mqtt.observe.warroom import Incident, apply_warroom
from vox_mqtt.observe.warroomguard import MasterOf, WarroomGuard
from vox_mqtt.observe.warroomreplay import WarroomOrder
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import InvalidMessage, TopicError
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, VOXMessage, parse
from vox_mqtt.protocol.signing import Signing
from vox_mqtt.transport.session import Inbound

__all__ = ["Refusal", "StatusIntake", "expiry_left", "read_status", "timeliness"]

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


def timeliness(signing: Signing | None) -> Timeliness | None:
    """Return how old a signed status may be (F23), or None where signatures are off and a
    status's emitted_at proves nothing (docs/security.md, replays)."""
    if signing is None or signing.mode == "off":
        return None
    return Timeliness(window=signing.replay_window, skew=signing.clock_skew)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A delivery not taken, and why.

    kind: `forged` (its signature failed, refused by the session), `dropped` (a post's size,
    rule or rate: warroomguard.py) or `replayed` (a post not newer, or older than the
    replay window: warroomreplay.py). problem: the reason first, then its details.
    """

    kind: Literal["forged", "dropped", "replayed"]
    problem: str

    @property
    def reason(self) -> str:
        """Return the problem's first word: `STALE`, `NOT_NEWER`, a forgery's reason."""
        return self.problem.partition(":")[0]


def _unknown(_agent: UUID) -> UUID | None:
    return None


def _unsigned() -> Signing | None:
    return None


_UNSET = object()


class StatusIntake:
    """Take status and war-room messages into a view of the fleet and a war room.

    view: where statuses go. signing: the reader's signing as it stands now (a reload may
    change its replay window). master_of: whom the reader knows as an agent's master, for
    the war room's self-or-child rule (a look knows none: it takes size and rate only,
    docs/broker.md). own: the reader's own id, if it publishes a status: its own statuses
    are read and returned, never put in the view.
    """

    def __init__(
        self,
        view: FleetView,
        *,
        signing: Callable[[], Signing | None] = _unsigned,
        master_of: MasterOf = _unknown,
        own: UUID | None = None,
    ) -> None:
        self.view = view
        self.own = own
        self.incidents: dict[tuple[UUID, UUID], Incident] = {}  # open in the war room
        self.on_incident: Callable[[Incident], None] | None = None  # new posts, resolutions
        self.on_refused: Callable[[Refusal], None] | None = None
        self.messages = 0  # status and war-room messages taken so far
        self.forged = 0  # refused: their signature did not verify
        # War-room posts not taken as replays, by reason: STALE (refused), NOT_NEWER (ignored).
        self.replays: Counter[str] = Counter()
        self._signing = signing
        self._master_of = master_of
        self._guard = WarroomGuard()  # size, self-or-child rule, rate per source
        self._order = WarroomOrder()  # replayed posts (docs/security.md), window per signing
        self._judged_by: object = _UNSET  # the signing the window and timeliness come from
        self._judge_by(signing())

    def take(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic | None = None
    ) -> VOXMessage | None:
        """Apply one delivery; return the status it carried, or None (a post, not taken).

        topic: the delivery's, if the caller parsed it already (an agent's session routes
        by it); else parsed here. A status returned is in the view already, unless it is the
        reader's own.
        """
        if inbound.forgery is not None:  # refused by the session (docs/security.md)
            self.forged += 1
            self._refuse("forged", inbound.forgery)
            return None
        if topic is None:
            try:
                parsed = topics.parse_topic(inbound.topic)
            except TopicError:
                return None
        else:
            parsed = topic
        self.messages += 1
        self._judge_by(self._signing())
        if isinstance(parsed, topics.WarroomTopic):
            self._take_post(inbound, parsed)
            return None
        if not isinstance(parsed, topics.StatusTopic):
            return None
        message = read_status(inbound, parsed)
        if message is None or parsed.agent == self.own:
            return message
        self.view.update(
            message,
            retained=inbound.retain,
            presence=parsed.presence,
            expiry_left=expiry_left(inbound, message),
        )
        return message

    def _take_post(self, inbound: Inbound, topic: topics.WarroomTopic) -> None:
        dropped = self._guard.refuse(
            topic.source, topic.subject, len(inbound.payload), self._master_of
        )
        if dropped is not None:
            self._refuse("dropped", dropped)
            return
        incident = apply_warroom(self.incidents, inbound, topic, self._order)
        if isinstance(incident, str):  # a replay (docs/security.md): never shown
            self.replays[incident.partition(":")[0]] += 1
            self._refuse("replayed", incident)
        elif incident is not None and not incident.again and self.on_incident is not None:
            self.on_incident(incident)

    def _refuse(self, kind: Literal["forged", "dropped", "replayed"], problem: str) -> None:
        if self.on_refused is not None:
            self.on_refused(Refusal(kind, problem))

    def _judge_by(self, signing: Signing | None) -> None:
        """Date statuses and posts by the signers' replay window: every bundle carries the
        fleet's (docs/security.md); a reload may bring another."""
        if signing is self._judged_by:
            return
        self._judged_by = signing
        self.view.timeliness = timeliness(signing)
        if signing is not None:
            self._order.window, self._order.skew = signing.replay_window, signing.clock_skew
