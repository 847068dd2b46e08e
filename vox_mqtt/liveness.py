"""An agent's liveness duties: birth, heartbeats, will, shutdown, watching children, war room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, Literal
from uuid import UUID

from . import topics
from ._version import __version__
from .errors import InvalidMessage, VoxError
from .messages import (
    MSG_SYSTEM_FAILURE,
    SystemFailure,
    VOXMessage,
    new_message,
    now_iso,
    parse,
    serialize,
)
from .status import (
    ACTIVE,
    INACTIVE,
    MSG_AGENT_STATUS,
    SHUTDOWN,
    STALE,
    VM_CONNECTION_LOST,
    AgentLiveness,
    AgentStatus,
    EpochCounter,
    host_metrics,
)
from .transport import Inbound, Will

if TYPE_CHECKING:
    from .agent import VOXAgent

__all__ = ["INCIDENT_EXPIRY", "Incident", "Liveness"]

log = logging.getLogger("vox_mqtt.liveness")

Severity = Literal["CRITICAL", "ERROR", "WARNING", "INFO"]

INCIDENT_EXPIRY: Final = 24 * 3600  # seconds a retained war-room post lives on the broker


class Incident:
    """One open war-room incident as an observer holds it."""

    def __init__(self, topic: topics.WarroomTopic, message: VOXMessage, failure: SystemFailure):
        self.topic = topic
        self.message = message
        self.failure = failure


class Liveness:
    """Publish this agent's status and act on the status of the agents it watches."""

    def __init__(self, agent: VOXAgent) -> None:
        self.agent = agent
        self.config = agent.config
        self.epoch_counter = EpochCounter(self.config.state_dir)
        self.epoch = self.epoch_counter.value
        self.started_at = now_iso()
        self.incidents: dict[tuple[UUID, UUID], Incident] = {}  # seen in the war room
        self._posted: dict[UUID, str] = {}  # subject -> error_code of incidents this agent opened
        self._advertised: list[str] | None = None
        self._host_alerts: set[str] = set()
        self.on_incident: Callable[[Incident], None] | None = None  # new posts and resolutions
        self._changes: asyncio.Queue[tuple[AgentLiveness, str, str]] = asyncio.Queue()
        agent.fleet_view.on_status_change = self._queue_change

    # --- own status -----------------------------------------------------------------------

    def _status_message(self, status: str, error_code: str | None) -> VOXMessage:
        target = self.config.master_id or topics.WARROOM_ID
        report = AgentStatus(
            name=self.config.name,
            status="ACTIVE" if status == ACTIVE else "INACTIVE",
            error_code=error_code,
            epoch=self.epoch,
            started_at=self.started_at,
            heartbeat_interval=self.config.heartbeat_interval,
            commands=self.agent.advertised_commands() if status == ACTIVE else [],
            version=__version__,
            metrics=host_metrics(self.config.state_dir) if status == ACTIVE else {},
        )
        return new_message(
            MSG_AGENT_STATUS,
            source=self.agent.id,
            target=target,
            details=report,
            message_source=self.config.message_source,
        )

    def will(self) -> Will | None:
        """Return the will for the next connection, which starts a new epoch."""
        if not self.config.publish_status:
            return None
        self.epoch = self.epoch_counter.next()
        message = self._status_message(INACTIVE, VM_CONNECTION_LOST)
        return Will(topic=topics.status(self.agent.id), payload=_bytes(message), retain=True)

    async def on_connect(self) -> None:
        """Publish the birth certificate of this connection."""
        if self.config.publish_status:
            await self.publish_status()

    async def publish_status(self) -> None:
        """Publish the retained ACTIVE status (birth, heartbeat, new advertisement)."""
        session = self.agent.session
        if session is None or not self.config.publish_status:
            return
        message = self._status_message(ACTIVE, None)
        self._advertised = list(message.details.get("commands", []))
        await session.publish(topics.status(self.agent.id), _bytes(message), retain=True)

    async def publish_shutdown(self) -> None:
        """Publish the retained INACTIVE SHUTDOWN status before a graceful disconnect."""
        session = self.agent.session
        if session is not None and self.config.publish_status:
            message = self._status_message(INACTIVE, SHUTDOWN)
            await session.publish(topics.status(self.agent.id), _bytes(message), retain=True)

    async def run(self) -> None:
        """Heartbeat, staleness checks and reactions to watched agents, until cancelled."""
        interval = self.config.heartbeat_interval
        tick = max(0.05, min(1.0, interval / 4))
        next_beat = time.monotonic() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    change = await self._changes.get()
                    await self._react(*change)
                    continue
            self.agent.fleet_view.refresh()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                await self._safely(self.publish_status())
                await self._safely(self._check_host())

    async def _safely(self, action: Awaitable[None]) -> None:
        try:
            await action
        except VoxError as exc:
            log.info("%s: liveness publish skipped: %s", self.config.name, exc)

    # --- watching others ------------------------------------------------------------------

    def _queue_change(self, entry: AgentLiveness, old: str, new: str) -> None:
        self._changes.put_nowait((entry, old, new))

    async def on_observed(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> None:
        """Take a status or war-room message the session delivered."""
        if isinstance(topic, topics.WarroomTopic):
            self._on_warroom(inbound, topic)
            return
        if not inbound.payload:
            return  # a cleared retained status
        try:
            message = parse(inbound.payload)
        except InvalidMessage as exc:
            log.warning("%s: bad status on %s: %s", self.config.name, inbound.topic, exc.reason)
            return
        if message.source != topic.agent or message.type != MSG_AGENT_STATUS:
            log.warning(
                "%s: status on %s claims source %s", self.config.name, inbound.topic, message.source
            )
            return
        self.agent.fleet_view.update(message, retained=inbound.retain)

    async def _react(self, entry: AgentLiveness, old: str, new: str) -> None:
        log.info(
            "%s: %s %s -> %s (epoch %s)",
            self.config.name,
            entry.name or entry.id,
            old,
            new,
            entry.epoch,
        )
        if entry.id not in self.config.children:
            return
        if self.config.publish_status and self.agent.advertised_commands() != self._advertised:
            await self._safely(self.publish_status())
        lost = new == STALE or (new == INACTIVE and entry.error_code == VM_CONNECTION_LOST)
        if lost:
            code = "HEARTBEAT_STALE" if new == STALE else VM_CONNECTION_LOST
            await self._safely(
                self.open_incident(
                    entry.id,
                    code,
                    f"child {entry.name or entry.id} is unreachable ({code}, epoch {entry.epoch})",
                    epoch=entry.epoch,
                )
            )
        elif new == ACTIVE or (new == INACTIVE and entry.error_code == SHUTDOWN):
            await self._safely(
                self.resolve_incident(
                    entry.id,
                    f"child {entry.name or entry.id} is {new.lower()} (epoch {entry.epoch})",
                )
            )

    def _on_warroom(self, inbound: Inbound, topic: topics.WarroomTopic) -> None:
        key = (topic.source, topic.subject)
        if not inbound.payload:
            self.incidents.pop(key, None)
            return
        try:
            message = parse(inbound.payload)
            failure = SystemFailure.model_validate(message.details)
        except (InvalidMessage, ValueError):
            log.warning("%s: bad war-room post on %s", self.config.name, inbound.topic)
            return
        if message.source != topic.source:
            return
        incident = Incident(topic, message, failure)
        if failure.resolved:
            self.incidents.pop(key, None)
        else:
            self.incidents[key] = incident
        if self.on_incident is not None:
            self.on_incident(incident)

    # --- the war room ---------------------------------------------------------------------

    async def open_incident(
        self,
        subject: UUID,
        error_code: str,
        description: str,
        *,
        epoch: int | None = None,
        severity: Severity = "CRITICAL",
    ) -> None:
        """Post a retained system_failure about subject, once per incident."""
        if self._posted.get(subject) == error_code:
            return
        self._posted[subject] = error_code
        failure = SystemFailure(
            error_code=error_code,
            severity=severity,
            description=description,
            subject=subject,
            epoch=epoch,
        )
        await self._post(subject, failure, retain=True)

    async def resolve_incident(self, subject: UUID, description: str) -> None:
        """Tell the war room an incident is over and clear its retained post."""
        if subject not in self._posted:
            return
        error_code = self._posted.pop(subject)
        failure = SystemFailure(
            error_code=error_code,
            severity="INFO",
            description=description,
            subject=subject,
            resolved=True,
        )
        await self._post(subject, failure, retain=False)
        session = self.agent.session
        if session is not None:
            await session.publish(topics.warroom(self.agent.id, subject), b"", retain=True)

    async def _post(self, subject: UUID, failure: SystemFailure, *, retain: bool) -> None:
        session = self.agent.session
        if session is None:
            return
        message = new_message(
            MSG_SYSTEM_FAILURE,
            source=self.agent.id,
            target=topics.WARROOM_ID,
            details=failure,
            message_source=self.config.message_source,
        )
        await self.agent.memory.record_message(message, "sent")
        await session.publish(
            topics.warroom(self.agent.id, subject),
            _bytes(message),
            retain=retain,
            expiry=INCIDENT_EXPIRY,
        )
        log.warning(
            "%s: war room: %s %s", self.config.name, failure.error_code, failure.description
        )

    async def _check_host(self) -> None:
        metrics = host_metrics(self.config.state_dir)
        limits = {
            "DISK_FULL": ("disk_percent", self.config.disk_alert_percent),
            "MEMORY_PRESSURE": ("memory_percent", self.config.memory_alert_percent),
        }
        failing = {
            code for code, (key, limit) in limits.items() if float(metrics.get(key, 0.0)) >= limit
        }
        for code in sorted(failing - self._host_alerts):
            key, limit = limits[code]
            await self.open_incident(
                self.agent.id,
                code,
                f"{self.config.name}: {key} {metrics[key]}% >= {limit}%",
                epoch=self.epoch,
            )
        if self._host_alerts and not failing:
            await self.resolve_incident(self.agent.id, f"{self.config.name}: host checks pass")
        self._host_alerts = failing


def _bytes(message: VOXMessage) -> bytes:
    return serialize(message)
