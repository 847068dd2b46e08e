"""An agent's liveness duties: birth, heartbeats, will, shutdown, watching children, war room."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from . import topics
from ._version import __version__
from .context import AgentContext
from .errors import VoxError
from .messages import (
    MSG_AGENT_STATUS,
    MSG_SYSTEM_FAILURE,
    AgentStatus,
    SystemFailure,
    VOXMessage,
    new_message,
    now_iso,
    serialize,
)
from .observer import read_status
from .settings import AgentConfig, Will
from .sitelinks import SITE_LINK_LOST, SiteLinkDuty
from .status import (
    ACTIVE,
    INACTIVE,
    RETIRED,
    SHUTDOWN,
    VM_CONNECTION_LOST,
    AgentLiveness,
    EpochCounter,
    FleetView,
    host_metrics,
)
from .transport import Inbound
from .warroom import (
    DISK_FULL,
    INCIDENT_EXPIRY,
    MEMORY_PRESSURE,
    Incident,
    Severity,
    apply_warroom,
    loss_code,
)
from .warroomguard import WarroomGuard

__all__ = ["CATCH_UP", "Liveness"]

log = logging.getLogger("vox_mqtt.liveness")

# Messages queued in our persistent session arrive within this many seconds of a reconnect.
CATCH_UP: Final = 2.0
_SAY_AGAIN: Final = 60.0  # seconds before the same publish failure is logged again


class _OpenIncidents:
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
        if code is None:
            self.codes.pop(subject, None)
        else:
            self.codes[subject] = code
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(k): v for k, v in self.codes.items()}), encoding="utf-8")
        os.replace(tmp, self.path)


class Liveness:
    """Publish this agent's status and act on the status of the agents it watches."""

    def __init__(
        self,
        ctx: AgentContext,
        *,
        fleet_view: FleetView,
        advertise: Callable[[], list[str]],
    ) -> None:
        self.ctx = ctx
        self.fleet_view = fleet_view
        self.advertise = advertise  # the commands this agent offers while ACTIVE
        self.epoch_counter = EpochCounter(self.config.state_dir)
        self.epoch = self.epoch_counter.value
        self.started_at = now_iso()
        self.connected_at: float | None = None  # monotonic time of the latest birth
        self._resumed = False  # the broker kept our session: queued old news may follow
        self.incidents: dict[tuple[UUID, UUID], Incident] = {}  # seen in the war room
        self.on_incident: Callable[[Incident], None] | None = None  # new posts and resolutions
        # Called with a child that said RETIRED (`vox fleet retire`): the agent forgets it.
        self.on_retired: Callable[[UUID], Awaitable[None]] | None = None
        self._forgotten: set[UUID] = set()  # former children: what still comes of them is old
        self._skipped: dict[str, float] = {}  # publish failures said, and when
        self._open = _OpenIncidents(self.config.state_dir)
        self._guard = WarroomGuard()  # size, self-or-child rule, rate per source
        self._advertised: list[str] | None = None
        self._changes: asyncio.Queue[tuple[AgentLiveness, str, str]] = asyncio.Queue()
        fleet_view.add_listener(self._queue_change)
        # A federated fleet: children behind a lost bridge are one site incident, not many.
        self.links = None if self.config.links is None else SiteLinkDuty(self.config.links)

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self.ctx.config

    # --- own status -----------------------------------------------------------------------

    def _status_message(
        self, status: str, error_code: str | None, metrics: dict[str, Any] | None = None
    ) -> VOXMessage:
        target = self.config.master_id or topics.WARROOM_ID
        report = AgentStatus(
            name=self.config.name,
            status="ACTIVE" if status == ACTIVE else "INACTIVE",
            error_code=error_code,
            epoch=self.epoch,
            started_at=self.started_at,
            heartbeat_interval=self.config.heartbeat_interval,
            commands=self.advertise() if status == ACTIVE else [],
            version=__version__,
            metrics=metrics or {},
        )
        return new_message(
            MSG_AGENT_STATUS,
            source=self.config.id,
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
        return Will(
            topic=topics.status(self.config.id),
            payload=serialize(message),
            retain=True,
            user_properties=self.ctx.publish_props.will(MSG_AGENT_STATUS),
        )

    async def on_connect(self) -> None:
        """Publish the birth certificate of this connection."""
        self.connected_at = time.monotonic()
        session = self.ctx.session
        self._resumed = session is not None and session.session_present
        if self.config.publish_status:
            await self.publish_status()

    async def publish_status(self, metrics: dict[str, Any] | None = None) -> None:
        """Publish the retained ACTIVE status (birth, heartbeat, new advertisement)."""
        session = self.ctx.session
        if session is None or not self.config.publish_status:
            return
        if metrics is None:
            metrics = host_metrics(self.config.state_dir)
        message = self._status_message(ACTIVE, None, metrics)
        self._advertised = list(message.details.get("commands", []))
        await session.publish(
            topics.status(self.config.id),
            serialize(message),
            retain=True,
            props=self.ctx.publish_props.own(MSG_AGENT_STATUS),
        )

    async def publish_shutdown(self) -> None:
        """Publish the retained INACTIVE SHUTDOWN status before a graceful disconnect."""
        session = self.ctx.session
        if session is not None and self.config.publish_status:
            message = self._status_message(INACTIVE, SHUTDOWN)
            await session.publish(
                topics.status(self.config.id),
                serialize(message),
                retain=True,
                props=self.ctx.publish_props.own(MSG_AGENT_STATUS),
            )

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
            self.fleet_view.refresh()
            await self._reconcile()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                await self._heartbeat()

    def _online(self) -> bool:
        # While the session is down a publish would wait for it: the birth covers the gap.
        session = self.ctx.session
        return session is not None and session.connected and self.config.publish_status

    async def _heartbeat(self) -> None:
        if not self._online():
            return
        metrics = host_metrics(self.config.state_dir)
        await self._safely(self.publish_status(metrics))
        await self._safely(self._check_host(metrics))

    async def _safely(self, action: Awaitable[None]) -> None:
        try:
            await action
        except VoxError as exc:
            # Incidents are retried every tick: the same refusal (e.g. a broker whose rules
            # changed before this agent was reloaded) is said once a minute, not 4 times a
            # second.
            text, now = str(exc), time.monotonic()
            said = self._skipped.get(text)
            level = (
                logging.DEBUG if said is not None and now - said < _SAY_AGAIN else logging.WARNING
            )
            if level == logging.WARNING:
                self._skipped = {t: at for t, at in self._skipped.items() if now - at < _SAY_AGAIN}
                self._skipped[text] = now
            log.log(level, "%s: liveness publish skipped: %s", self.config.name, text)

    # --- watching others ------------------------------------------------------------------

    def on_link(self, inbound: Inbound) -> None:
        """Take a bridge link's state (docs/federation.md); the next reconcile acts on it."""
        change = None if self.links is None else self.links.take(inbound.topic, inbound.payload)
        if change is not None:
            link, up = change
            state = "up" if up else "DOWN"
            log.warning("%s: the bridge link of site %s is %s", self.config.name, link.site, state)

    def _master_of(self, agent_id: UUID) -> UUID | None:
        """Return an agent's master as this agent knows it (config, then statuses)."""
        if agent_id == self.config.id:
            return self.config.master_id
        if agent_id in self.config.children:
            return self.config.id
        entry = self.fleet_view.get(agent_id)
        return None if entry is None else entry.master_id

    def _queue_change(self, entry: AgentLiveness, old: str, new: str) -> None:
        self._changes.put_nowait((entry, old, new))

    async def on_observed(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> None:
        """Take a status or war-room message the session delivered."""
        if isinstance(topic, topics.WarroomTopic):
            refused = self._guard.refuse(
                topic.source, topic.subject, len(inbound.payload), self._master_of
            )
            if refused is not None:
                log.warning("%s: war room: dropped a post: %s", self.config.name, refused)
                return
            incident = apply_warroom(self.incidents, inbound, topic)
            if incident is not None and self.on_incident is not None:
                self.on_incident(incident)
            return
        message = read_status(inbound, topic)
        if message is None:
            return
        if topic.agent == self.config.id:
            await self._on_own_status(message, retained=inbound.retain)
        elif topic.agent in self._forgotten:
            return
        else:
            self.fleet_view.update(message, retained=inbound.retain)
            if (
                topic.agent in self.config.children
                and message.details.get("error_code") == RETIRED
                and self.on_retired is not None
            ):
                log.warning(
                    "%s: retired: forgets %s (%s)",
                    self.config.name,
                    self.config.children[topic.agent],
                    topic.agent,
                )
                await self.on_retired(topic.agent)
                return
            if (
                topic.agent in self.config.children
                and self._online()
                and self.advertise() != self._advertised
            ):
                # A child that stays ACTIVE may still gain or lose commands (its own
                # children came or went): pass that up now, not at the next heartbeat.
                await self._safely(self.publish_status())

    async def _on_own_status(self, message: VOXMessage, *, retained: bool) -> None:
        """Put our birth back when a late status of an older session replaced it."""
        epoch = message.details.get("epoch")
        # A retained copy at subscribe time is the previous session's last word, before
        # our birth; only a live one that is older than this session is an intruder.
        if retained or not isinstance(epoch, int) or epoch >= self.epoch or not self._online():
            return
        log.warning(
            "%s: a status of epoch %d replaced ours (epoch %d): publishing ours again",
            self.config.name,
            epoch,
            self.epoch,
        )
        await self._safely(self.publish_status())

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
        if self._online() and self.advertise() != self._advertised:
            # A child's commands join or leave this agent's advertisement at once.
            await self._safely(self.publish_status())
        await self._reconcile()

    async def _reconcile(self) -> None:
        """Open an incident per lost child and resolve those that are back (level-triggered)."""
        if not self._online() or self.connected_at is None:
            return
        since_connect = time.monotonic() - self.connected_at
        for child_id in self.config.children:
            entry = self.fleet_view.get(child_id)
            if entry is None or not entry.seen:
                continue
            code = loss_code(entry)
            grace = max(
                self.config.stale_after * entry.heartbeat_interval,
                self.config.broker.reconnect_max,
            )
            if self.links is not None and self.links.holds(child_id, entry.received_at, grace):
                continue  # the site's one SITE_LINK_LOST incident stands for it
            name = entry.name or str(child_id)
            if code is not None and child_id not in self._open.codes:
                # What was retained or queued for us while we were away (e.g. the wills a
                # broker publishes as it stops) is old news: a child that is fine is reborn
                # within this grace after our own reconnect, its backoff included.
                queued = self._resumed and entry.received_at < self.connected_at + CATCH_UP
                if (entry.retained or queued) and since_connect < grace:
                    continue
                await self._safely(
                    self.open_incident(
                        child_id,
                        code,
                        f"child {name} is unreachable ({code}, epoch {entry.epoch})",
                        epoch=entry.epoch,
                    )
                )
            elif code is None and child_id in self._open.codes:
                state = "back" if entry.status == ACTIVE else "stopped (SHUTDOWN)"
                await self._safely(
                    self.resolve_incident(child_id, f"child {name} is {state}, epoch {entry.epoch}")
                )
        if self.links is not None:
            await self._reconcile_links(self.links)
        for subject in list(self._open.codes):
            if self.links is not None and self.links.link(subject) is not None:
                continue
            if subject != self.config.id and subject not in self.config.children:
                await self._safely(self.resolve_incident(subject, "no longer a child"))

    def expect(self, children: set[UUID]) -> None:
        """Take statuses of these (new) children again, before their subscription is made."""
        self._forgotten -= children

    async def children_changed(self, added: set[UUID], removed: set[UUID]) -> None:
        """Follow a change of children: forget the removed, resolve their incidents, advertise."""
        self._forgotten = (self._forgotten | removed) - added
        for child in removed:
            self.fleet_view.forget(child)
        await self._reconcile()
        if self._online() and self.advertise() != self._advertised:
            await self._safely(self.publish_status())

    async def _reconcile_links(self, links: SiteLinkDuty) -> None:
        """Hold one SITE_LINK_LOST incident per lost link this agent owns; resolve it when back."""
        down = {link.id: link for link in links.owned_down()}
        for bridge, link in down.items():
            if bridge not in self._open.codes:
                description = (
                    f"site {link.site}: the bridge link is down; "
                    f"{len(link.behind)} agent(s) behind it unreachable"
                )
                await self._safely(self.open_incident(bridge, SITE_LINK_LOST, description))
        for subject, code in list(self._open.codes.items()):
            if code == SITE_LINK_LOST and subject not in down and links.known_up(subject):
                known = links.link(subject)
                site = known.site if known is not None else str(subject)
                await self._safely(
                    self.resolve_incident(subject, f"site {site}: the bridge link is back")
                )

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
        if subject in self._open.codes:
            return  # one alert per incident: a STALE that becomes a will is the same one
        failure = SystemFailure(
            error_code=error_code,
            severity=severity,
            description=description,
            subject=subject,
            epoch=epoch,
        )
        await self._post(subject, failure, retain=True)
        self._open.set(subject, error_code)

    async def resolve_incident(self, subject: UUID, description: str) -> None:
        """Tell the war room an incident is over and clear its retained post."""
        error_code = self._open.codes.get(subject)
        session = self.ctx.session
        if error_code is None or session is None:
            return
        failure = SystemFailure(
            error_code=error_code,
            severity="INFO",
            description=description,
            subject=subject,
            resolved=True,
        )
        await self._post(subject, failure, retain=False)
        await session.publish(topics.warroom(self.config.id, subject), b"", retain=True)
        self._open.set(subject, None)

    async def _post(self, subject: UUID, failure: SystemFailure, *, retain: bool) -> None:
        session = self.ctx.session
        if session is None:
            raise VoxError(f"{self.config.name} has no MQTT session")
        message = new_message(
            MSG_SYSTEM_FAILURE,
            source=self.config.id,
            target=topics.WARROOM_ID,
            details=failure,
            message_source=self.config.message_source,
        )
        await self.ctx.ledger.record_message(message, "sent")
        await session.publish(
            topics.warroom(self.config.id, subject),
            serialize(message),
            retain=retain,
            props=self.ctx.publish_props.own(MSG_SYSTEM_FAILURE, expiry=INCIDENT_EXPIRY),
        )
        # An incident is news a person should see (WARNING); its resolution is not (INFO).
        log.log(
            logging.INFO if failure.resolved else logging.WARNING,
            "%s: war room: %s%s %s",
            self.config.name,
            failure.error_code,
            " resolved:" if failure.resolved else "",
            failure.description,
        )

    async def _check_host(self, metrics: dict[str, Any]) -> None:
        limits = (
            (DISK_FULL, "disk_percent", self.config.disk_alert_percent),
            (MEMORY_PRESSURE, "memory_percent", self.config.memory_alert_percent),
        )
        failing = [
            (code, f"{key} {metrics[key]}% >= {limit:g}%")
            for code, key, limit in limits
            if float(metrics.get(key, 0.0)) >= limit
        ]
        me = self.config.id
        if failing and me not in self._open.codes:
            text = "; ".join(reason for _, reason in failing)
            await self.open_incident(
                me, failing[0][0], f"{self.config.name}: {text}", epoch=self.epoch, severity="ERROR"
            )
        elif not failing and me in self._open.codes:
            await self.resolve_incident(me, f"{self.config.name}: host checks pass")
