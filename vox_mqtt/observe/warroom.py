"""The war room: incidents as observers hold them, and why an agent counts as lost."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Final, Literal
from uuid import UUID

from vox_mqtt.observe.status import (
    INACTIVE,
    RETIRED,
    SHUTDOWN,
    STALE,
    VM_CONNECTION_LOST,
    AgentLiveness,
)
from vox_mqtt.observe.warroomreplay import WarroomOrder
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.messages import VOXMessage, parse
from vox_mqtt.protocol.signing import SignedTopic
from vox_mqtt.transport.session import Inbound

__all__ = [
    "CHILD_MISBEHAVING",
    "DISK_FULL",
    "HEARTBEAT_STALE",
    "INCIDENT_CODE",
    "INCIDENT_EXPIRY",
    "MEMORY_PRESSURE",
    "SEVERITY_RANK",
    "Incident",
    "OpenIncidents",
    "Severity",
    "apply_warroom",
    "loss_code",
    "read_warroom",
]

log = logging.getLogger("vox_mqtt.liveness")

Severity = Literal["CRITICAL", "ERROR", "WARNING", "INFO"]

INCIDENT_EXPIRY: Final = 24 * 3600  # seconds a retained war-room post lives on the broker
HEARTBEAT_STALE: Final = "HEARTBEAT_STALE"
# A child's status broke a bound (docs/liveness.md): ignored, and the child gets no work.
CHILD_MISBEHAVING: Final = "CHILD_MISBEHAVING"
DISK_FULL: Final = "DISK_FULL"
MEMORY_PRESSURE: Final = "MEMORY_PRESSURE"


class Incident:
    """One war-room post as an observer holds it: open, or the resolution of one."""

    def __init__(self, topic: topics.WarroomTopic, message: VOXMessage, failure: SystemFailure):
        self.topic = topic
        self.message = message
        self.failure = failure
        # The same open incident posted again within the replay window (docs/security.md):
        # taken, so its newer time is held, but not news.
        self.again = False

    @property
    def key(self) -> tuple[UUID, UUID]:
        """Return (source, subject): one open incident per pair."""
        return (self.topic.source, self.topic.subject)

    def as_dict(self) -> dict[str, Any]:
        """Return the post as JSON-ready data."""
        failure = self.failure
        return {
            "source": str(self.topic.source),
            "subject": str(self.topic.subject),
            "error_code": failure.error_code,
            "severity": failure.severity,
            "description": failure.description,
            "epoch": failure.epoch,
            "resolved": failure.resolved,
            "emitted_at": self.message.emitted_at,
            "message_id": str(self.message.message_id),
        }


def read_warroom(inbound: Inbound, topic: topics.WarroomTopic) -> Incident | None:
    """Return the war-room post on a topic, or None when it is a clear or not valid."""
    if not inbound.payload:
        return None
    try:
        message = parse(inbound.payload)
        failure = SystemFailure.model_validate(message.details)
    except (InvalidMessage, ValueError):
        log.warning("bad war-room post on %s", inbound.topic)
        return None
    if message.source != topic.source or message.type != MSG_SYSTEM_FAILURE:
        return None
    return Incident(topic, message, failure)


def apply_warroom(
    incidents: dict[tuple[UUID, UUID], Incident],
    inbound: Inbound,
    topic: topics.WarroomTopic,
    order: WarroomOrder | None = None,
    *,
    now: float | None = None,
) -> Incident | str | None:
    """Update the open incidents from one war-room message; return the post it carried.

    With order, a replayed post is not taken (docs/security.md, replays): the problem is
    returned instead, reason first (`STALE`: refused, count it; `NOT_NEWER`: ignored).
    """
    incident = read_warroom(inbound, topic)
    if incident is not None and order is not None:
        problem = order.judge(
            incident.key,
            incident.message.emitted_at,
            signed=isinstance(inbound.topic, SignedTopic),
            now=time.time() if now is None else now,
            resolved=incident.failure.resolved,
        )
        if problem is not None:
            return problem
    if incident is None or incident.failure.resolved:
        incidents.pop((topic.source, topic.subject), None)
    else:
        held = incidents.get(incident.key)
        incident.again = held is not None and held.failure == incident.failure
        incidents[incident.key] = incident
    return incident


def loss_code(entry: AgentLiveness) -> str | None:
    """Return why an agent counts as lost (an incident), or None if it is not."""
    if entry.misbehaving():
        return CHILD_MISBEHAVING
    if entry.status == STALE:
        return HEARTBEAT_STALE
    if entry.status == INACTIVE and entry.error_code not in (SHUTDOWN, RETIRED):
        return entry.error_code or VM_CONNECTION_LOST
    return None


# An incident's error_code, as a role may raise one.
INCIDENT_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
SEVERITY_RANK: Final[tuple[Severity, ...]] = ("CRITICAL", "ERROR", "WARNING", "INFO")


class OpenIncidents:
    """The incidents this agent opened and has not resolved, kept across restarts."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "incidents.json"
        self.codes: dict[UUID, str] = {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            self.codes = {UUID(k): str(v) for k, v in raw.items()}
        except (OSError, ValueError, AttributeError):
            pass  # none yet, or a torn file: at worst an old post stays until it expires

    def set(self, subject: UUID, code: str | None) -> None:
        """Record (or, with None, forget) the open incident about subject."""
        if code is None:
            self.codes.pop(subject, None)
        else:
            self.codes[subject] = code
        tmp = self.path.with_suffix(".tmp")
        try:
            text = json.dumps({str(k): v for k, v in self.codes.items()})
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            # A full disk must not stop the alert about it: kept in memory for this run.
            log.warning("open incidents kept in memory only: %s", exc)
