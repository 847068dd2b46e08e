"""What an agent posts to the war room: one incident about itself, one per lost child or link."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any
from uuid import UUID

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.sendrules import check_size
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.warroom import (
    DISK_FULL,
    INCIDENT_CODE,
    INCIDENT_EXPIRY,
    MEMORY_PRESSURE,
    SEVERITY_RANK,
    OpenIncidents,
    Severity,
)
from vox_mqtt.observe.warroomreplay import refresh_due
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.errors import DeliveryFailed, LedgerError, VoxError
from vox_mqtt.protocol.messages import VOXMessage, new_message, serialize

__all__ = ["WarroomPoster"]

# The posts are liveness news: one logger for both, so a filter on it sees every incident.
log = logging.getLogger("vox_mqtt.liveness")

# After a restart, an incident held from before is first re-posted this long after start
# (or at half the window, if sooner): liveness resolves it first if it is over.
_RESTART_GRACE = 30.0


class WarroomPoster:
    """Open and resolve this agent's war-room incidents, each posted once (docs/liveness.md).

    It is told what to post; when to post about a child or a link is for liveness to decide.
    """

    def __init__(self, ctx: AgentContext, *, epoch: Callable[[], int]) -> None:
        self.ctx = ctx
        self._epoch = epoch  # the current connection's epoch, named in the post about itself
        self._open = OpenIncidents(ctx.config.state_dir)
        # What is wrong with this agent itself, by code: its host checks and its roles'
        # causes; one war-room incident about it carries them all (see _post_own).
        self._host_causes: dict[str, tuple[Severity, str]] = {}
        self._role_causes: dict[str, tuple[Severity, str]] = {}
        self._own_posted: tuple[str, ...] = ()
        # Each open incident's retained post and when it went out (monotonic): re-posted
        # within the replay window, or readers would refuse it STALE (docs/security.md).
        self._retained: dict[UUID, tuple[SystemFailure, float]] = {}
        self._started = time.monotonic()

    @property
    def open_codes(self) -> Mapping[UUID, str]:
        """Return the open incidents by subject, with the code each was posted with."""
        return MappingProxyType(self._open.codes)

    # --- this agent's own incident ----------------------------------------------------------

    async def raise_own(
        self, error_code: str, description: str, *, severity: Severity = "ERROR"
    ) -> bool:
        """Add a cause to this agent's own incident; False if that cause is already open."""
        if not INCIDENT_CODE.fullmatch(error_code):
            raise ValueError(f"error_code {error_code!r} must be UPPER_SNAKE_CASE, 1-64 chars")
        if error_code in self._role_causes:
            return False  # one post per incident, however often the role raises it
        self._role_causes[error_code] = (severity, description[:500])
        await self._post_own(f"{self.ctx.config.name}: {description}")
        return True

    async def resolve_own(self, error_code: str, description: str) -> bool:
        """Remove a cause from this agent's own incident; False if it was not open."""
        if self._role_causes.pop(error_code, None) is None:
            return False
        await self._post_own(f"{self.ctx.config.name}: {description}")
        return True

    async def check_host(self, metrics: dict[str, Any]) -> None:
        """Hold a cause of the own incident while the host's disk or memory is past its limit."""
        config = self.ctx.config
        limits = (
            (DISK_FULL, "disk_percent", config.disk_alert_percent),
            (MEMORY_PRESSURE, "memory_percent", config.memory_alert_percent),
        )
        failing = [
            (code, f"{key} {metrics[key]}% >= {limit:g}%")
            for code, key, limit in limits
            if float(metrics.get(key, 0.0)) >= limit
        ]
        causes: dict[str, tuple[Severity, str]] = {}
        if failing:
            text = "; ".join(reason for _, reason in failing)
            causes[failing[0][0]] = ("ERROR", text)
        if causes != self._host_causes or (
            not causes and config.id in self._open.codes and not self._role_causes
        ):
            self._host_causes = causes
            await self._post_own(f"{config.name}: host checks pass")

    async def _post_own(self, why: str) -> None:
        """Make the war room's one post about this agent say what is wrong with it now.

        The broker lets an agent post about itself on one topic only, and observers hold
        one incident per (source, subject): the host checks and a role's causes share that
        incident. A new or removed cause posts once; the last one gone resolves it.
        """
        name, me = self.ctx.config.name, self.ctx.config.id
        causes = {**self._host_causes, **self._role_causes}
        if not causes:
            self._own_posted = ()
            if me in self._open.codes:
                await self.resolve_incident(me, why[:1000])
            return
        codes = tuple(causes)
        if codes == self._own_posted and me in self._open.codes:
            return
        severity = min((s for s, _ in causes.values()), key=SEVERITY_RANK.index)
        parts = [
            desc if len(causes) == 1 else f"{desc} ({code})" for code, (_, desc) in causes.items()
        ]
        text = f"{name}: {'; '.join(parts)}"[:1000]
        failure = SystemFailure(
            error_code=codes[0],
            severity=severity,
            description=text,
            subject=me,
            epoch=self._epoch(),
        )
        await self._post(me, failure, retain=True)
        self._open.set(me, codes[0])
        self._own_posted = codes

    # --- any subject ------------------------------------------------------------------------

    async def open_incident(
        self,
        subject: UUID,
        error_code: str,
        description: str,
        *,
        epoch: int | None = None,
        severity: Severity = "CRITICAL",
        replace: bool = False,
        decided_on: int | None = None,
    ) -> None:
        """Post a retained system_failure about subject, once per incident.

        With replace, an open incident about subject with another code gives way to this
        one: the new retained post takes the old one's place on the same topic. decided_on:
        the session's connection the decision was taken on (default: the one up now).
        """
        held = self._open.codes.get(subject)
        if held is not None and not (replace and held != error_code):
            return  # one alert per incident: a STALE that becomes a will is the same one
        failure = SystemFailure(
            error_code=error_code,
            severity=severity,
            description=description,
            subject=subject,
            epoch=epoch,
        )
        await self._post(subject, failure, retain=True, decided_on=decided_on)
        # Only once posted: a post skipped (offline) leaves the old incident owned, so the
        # retained post about subject is always one this agent will resolve.
        self._open.set(subject, error_code)

    async def resolve_incident(self, subject: UUID, description: str) -> None:
        """Tell the war room an incident is over and clear its retained post."""
        error_code = self._open.codes.get(subject)
        if error_code is None:
            return
        failure = SystemFailure(
            error_code=error_code,
            severity="INFO",
            description=description,
            subject=subject,
            resolved=True,
        )
        await self._post(subject, failure, retain=False)
        await self.ctx.session.publish(
            topics.warroom(self.ctx.config.id, subject), b"", retain=True
        )
        self._open.set(subject, None)
        self._retained.pop(subject, None)

    async def refresh(self) -> None:
        """Post again each open incident's retained post before the replay window ages it.

        A reader refuses a signed post older than the window (a replay, docs/security.md),
        and an incident may stay open for a day: its post must stay younger than that.
        """
        signing = self.ctx.config.broker.signing
        if signing is None or not signing.signs or not self.ctx.session.connected:
            return
        now = time.monotonic()
        for subject, code in list(self._open.codes.items()):
            held = self._retained.get(subject)
            if held is None:
                # Opened before this agent restarted: its text is gone, its code is kept.
                # First re-posted once liveness had time to resolve it (docs/liveness.md).
                failure = SystemFailure(
                    error_code=code,
                    severity="ERROR" if subject == self.ctx.config.id else "CRITICAL",
                    description=f"{self.ctx.config.name}: {code} (open since before a restart)",
                    subject=subject,
                )
                half = signing.replay_window / 2
                held = (failure, self._started - half + min(_RESTART_GRACE, half))
            if refresh_due(held[1], now, signing.replay_window):
                await self._post(subject, held[0], retain=True, again=True)

    async def _post(
        self,
        subject: UUID,
        failure: SystemFailure,
        *,
        retain: bool,
        again: bool = False,
        decided_on: int | None = None,
    ) -> None:
        config, session = self.ctx.config, self.ctx.session
        message = new_message(
            MSG_SYSTEM_FAILURE,
            source=config.id,
            target=topics.WARROOM_ID,
            details=failure,
            message_source=config.message_source,
        )
        connection = session.connection_count if decided_on is None else decided_on
        try:
            await self.ctx.ledger.record_message(message, LedgerAction.SENT)
        except LedgerError as exc:
            # The alert matters more than its record (the disk may be what is full).
            log.warning("%s: war-room post not recorded: %s", config.name, exc)
        # Only on the connection it was decided on (no newer one since, not even one being
        # set up): carried over to the next one it would go out as old news (a stopping
        # broker sends its clients' wills to those still connected just before it closes
        # them): liveness's reconcile decides anew then.
        topic = topics.warroom(config.id, subject)
        pending = None
        if session.connection_count == connection:
            pending = session.publish_soon(
                topic,
                self._checked(message),
                retain=retain,
                props=self.ctx.publish_props.own(MSG_SYSTEM_FAILURE, expiry=INCIDENT_EXPIRY),
            )
        if pending is None:
            raise VoxError(f"{config.name}: offline, war-room post skipped")
        try:
            async with asyncio.timeout(config.broker.publish_timeout):
                outcome = await pending
        except TimeoutError:
            raise DeliveryFailed(f"{config.name}: war-room post not acknowledged") from None
        if not outcome.accepted:
            raise outcome.error(topic)
        if retain:
            self._retained[subject] = (failure, time.monotonic())
        # An incident is news a person should see (WARNING); its resolution is not (INFO),
        # nor the same incident posted again within the replay window (DEBUG).
        log.log(
            logging.DEBUG if again else logging.INFO if failure.resolved else logging.WARNING,
            "%s: war room: %s%s %s",
            config.name,
            failure.error_code,
            " resolved:" if failure.resolved else "",
            failure.description,
        )

    def _checked(self, message: VOXMessage) -> bytes:
        """Serialize, refusing (MessageTooLarge) what the broker would drop us for."""
        check_size(message, payload := serialize(message), self.ctx.config.max_message_bytes)
        return payload
