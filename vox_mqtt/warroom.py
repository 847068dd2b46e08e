"""The war room: incidents as observers hold them, and why an agent counts as lost."""

from __future__ import annotations

import logging
from typing import Any, Final, Literal
from uuid import UUID

from . import topics
from .errors import InvalidMessage
from .messages import MSG_SYSTEM_FAILURE, SystemFailure, VOXMessage, parse
from .status import INACTIVE, RETIRED, SHUTDOWN, STALE, VM_CONNECTION_LOST, AgentLiveness
from .transport import Inbound

__all__ = [
    "DISK_FULL",
    "HEARTBEAT_STALE",
    "INCIDENT_EXPIRY",
    "MEMORY_PRESSURE",
    "Incident",
    "Severity",
    "apply_warroom",
    "loss_code",
    "read_warroom",
]

log = logging.getLogger("vox_mqtt.liveness")

Severity = Literal["CRITICAL", "ERROR", "WARNING", "INFO"]

INCIDENT_EXPIRY: Final = 24 * 3600  # seconds a retained war-room post lives on the broker
HEARTBEAT_STALE: Final = "HEARTBEAT_STALE"
DISK_FULL: Final = "DISK_FULL"
MEMORY_PRESSURE: Final = "MEMORY_PRESSURE"


class Incident:
    """One war-room post as an observer holds it: open, or the resolution of one."""

    def __init__(self, topic: topics.WarroomTopic, message: VOXMessage, failure: SystemFailure):
        self.topic = topic
        self.message = message
        self.failure = failure

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
    incidents: dict[tuple[UUID, UUID], Incident], inbound: Inbound, topic: topics.WarroomTopic
) -> Incident | None:
    """Update the open incidents from one war-room message; return the post it carried."""
    incident = read_warroom(inbound, topic)
    if incident is None or incident.failure.resolved:
        incidents.pop((topic.source, topic.subject), None)
    else:
        incidents[incident.key] = incident
    return incident


def loss_code(entry: AgentLiveness) -> str | None:
    """Return why an agent counts as lost (an incident), or None if it is not."""
    if entry.status == STALE:
        return HEARTBEAT_STALE
    if entry.status == INACTIVE and entry.error_code not in (SHUTDOWN, RETIRED):
        return entry.error_code or VM_CONNECTION_LOST
    return None
