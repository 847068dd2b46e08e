"""How long an agent has been down, or how old its heartbeat is: one answer for every view."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vox_mqtt.observe.status import (
    ACTIVE,
    INACTIVE,
    SHUTDOWN,
    STALE,
    VM_CONNECTION_LOST,
    AgentLiveness,
)
from vox_mqtt.observe.warroom import HEARTBEAT_STALE, Incident
from vox_mqtt.protocol.messages import parse_timestamp

from ._common import duration

__all__ = ["Liveliness", "liveliness"]


@dataclass(frozen=True, kw_only=True)
class Liveliness:
    """An agent's heartbeat age (when live) or how long it has been down (when not)."""

    heartbeat_age: float | None = None  # ACTIVE only
    down_for: float | None = None  # INACTIVE and STALE only
    at_most: bool = False  # down_for is an upper bound: only the will's age is known

    def text(self) -> str:
        """Return the cell a person reads: `heartbeat 2.1s ago` or `down for 5m 12s`."""
        if self.heartbeat_age is not None:
            return f"heartbeat {duration(self.heartbeat_age)} ago"
        if self.down_for is not None:
            return f"down for {'≤ ' if self.at_most else ''}{duration(self.down_for)}"
        return "-"

    def as_dict(self) -> dict[str, Any]:
        """Return the figures for --json."""
        return {
            "down_for_s": None if self.down_for is None else round(self.down_for, 3),
            "down_for_at_most": self.at_most,
        }


def liveliness(
    entry: AgentLiveness, incidents: Iterable[Incident] = (), now: float | None = None
) -> Liveliness:
    """Say how live an agent is from its status and, when readable, the war room.

    A will is built when its session starts, so a retained will's emitted_at is the
    connect time, not the loss: the master's war-room post about the loss dates it
    instead, and without one the will's age is only an upper bound.
    """
    now = time.monotonic() if now is None else now
    age = entry.heartbeat_age(now)
    if age is None:
        return Liveliness()
    if entry.status == ACTIVE:
        return Liveliness(heartbeat_age=age)
    if entry.status == STALE:
        return Liveliness(down_for=age)  # silent since its last heartbeat arrived
    if entry.status != INACTIVE:
        return Liveliness()
    if not entry.retained or entry.error_code == SHUTDOWN or entry.lost_at_known:
        # Received live (the broker sent the will when the loss happened), a will whose
        # expiry left tells when the broker published it (docs/liveness.md, the will's
        # time), or a shutdown, whose emitted_at is the moment it stopped.
        return Liveliness(down_for=age)
    posted = _loss_posted(entry, incidents)
    if posted is not None:
        return Liveliness(down_for=posted)
    return Liveliness(down_for=age, at_most=entry.error_code in (None, VM_CONNECTION_LOST))


def _loss_posted(entry: AgentLiveness, incidents: Iterable[Incident]) -> float | None:
    """Return the age of the oldest open war-room post about this agent's current loss."""
    ages = []
    for incident in incidents:
        failure = incident.failure
        if incident.topic.subject != entry.id or failure.resolved:
            continue
        if failure.error_code not in (VM_CONNECTION_LOST, HEARTBEAT_STALE):
            continue  # a host alert (disk, memory) says nothing about being reachable
        if failure.epoch is not None and failure.epoch != entry.epoch:
            continue
        try:
            sent = parse_timestamp(incident.message.emitted_at)
        except ValueError:
            continue
        ages.append(max(0.0, (datetime.now(UTC) - sent).total_seconds()))
    return max(ages) if ages else None
