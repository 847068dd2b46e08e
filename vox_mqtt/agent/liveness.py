"""An agent's liveness: its parts wired, and the one loop that keeps their time.

Three parts, one concept each (docs/liveness.md):

- `OwnStatus` (ownstatus.py): what this agent says of itself: birth, heartbeats, will,
  SHUTDOWN;
- `ChildrenWatch` (childwatch.py): what it learns of the agents it watches, through the
  observe package's intake: statuses, its children's ledger heads, site links, war-room
  posts;
- `Reconciler` (reconcile.py): what it keeps in the war room: its own incident, one per
  lost child or link.

`Liveness` builds them, hands the agent's calls to the part that answers them, and runs
the loop: each change of a watched agent, each tick, each heartbeat. What crosses parts
is decided here: a child's change may change our advertisement, and reconciling may end
a child's hold as misbehaving, which gives its commands back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from vox_mqtt.agent.cadence import next_heartbeat
from vox_mqtt.agent.childwatch import ChildrenWatch
from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.logonce import Repeats
from vox_mqtt.agent.ownstatus import OwnStatus
from vox_mqtt.agent.reconcile import Reconciler
from vox_mqtt.observe.status import AgentLiveness, FleetView
from vox_mqtt.observe.warroom import Incident, Severity
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.settings import AgentConfig, Will
from vox_mqtt.transport.session import Inbound

__all__ = ["Liveness"]

log = logging.getLogger("vox_mqtt.liveness")


class Liveness:
    """Publish this agent's status and act on the status of the agents it watches."""

    def __init__(
        self,
        ctx: AgentContext,
        *,
        fleet_view: FleetView,
        advertise: Callable[[], list[str]],
        params: Callable[[list[str]], dict[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.fleet_view = fleet_view
        self._said = Repeats(log)  # a post retried at every tick is said once a minute
        self.own = OwnStatus(ctx, advertise=advertise, params=params, safely=self._safely)
        self.watch = ChildrenWatch(ctx, fleet_view)
        self.warroom = Reconciler(
            ctx,
            fleet_view=fleet_view,
            links=self.watch.links,
            epoch=lambda: self.own.epoch,
            online=self.own.online,
            safely=self._safely,
        )

    @property
    def config(self) -> AgentConfig:
        """The agent's config as it stands: the context's cell, which a reload replaces."""
        return self.ctx.config

    @property
    def epoch(self) -> int:
        """Return the epoch of the current (or last) connection."""
        return self.own.epoch

    @property
    def incidents(self) -> dict[tuple[UUID, UUID], Incident]:
        """Return the incidents open in the war room, as this agent has seen them."""
        return self.watch.incidents

    # --- the agent's calls, each to its part ----------------------------------------------

    def will(self) -> Will | None:
        """Return the will for the next connection, which starts a new epoch."""
        return self.own.will()

    async def on_connect(self) -> None:
        """Publish the birth certificate of this connection."""
        self.warroom.connected()
        await self.own.birth()

    async def publish_status(
        self, metrics: dict[str, Any] | None = None, *, presence: bool = False
    ) -> None:
        """Publish the retained ACTIVE status (ownstatus.py)."""
        await self.own.publish_status(metrics, presence=presence)

    async def publish_shutdown(self, bound: float | None = None) -> None:
        """Publish the retained INACTIVE SHUTDOWN status (ownstatus.py)."""
        await self.own.publish_shutdown(bound)

    def on_link(self, inbound: Inbound) -> None:
        """Take a bridge link's state (docs/federation.md); the next reconcile acts on it."""
        self.watch.on_link(inbound)

    async def on_observed(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> None:
        """Take a status or war-room message the session delivered."""
        status = self.watch.take(inbound, topic)
        if status is None:
            return
        if status.source == self.config.id:
            await self.own.on_own_status(status, retained=inbound.retain)
        elif status.source in self.config.children:
            # A child that stays ACTIVE may still gain or lose commands (its own children
            # came or went): pass that up now, not at the next heartbeat.
            await self._advertise_if_changed()

    async def raise_own(
        self, error_code: str, description: str, *, severity: Severity = "ERROR"
    ) -> bool:
        """Add a cause to this agent's own incident; False if that cause is already open."""
        return await self.warroom.raise_own(error_code, description, severity=severity)

    async def resolve_own(self, error_code: str, description: str) -> bool:
        """Remove a cause from this agent's own incident; False if it was not open."""
        return await self.warroom.resolve_own(error_code, description)

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Heartbeat, staleness checks and reactions to watched agents, until cancelled."""
        interval = self.config.heartbeat_interval
        tick = max(0.05, min(1.0, interval / 4))
        next_beat = time.monotonic() + interval
        while True:
            change = await self.watch.next_change(tick)
            if change is not None:
                await self._react(*change)
                continue
            self.fleet_view.refresh()
            if self.own.state_stale() and self.own.online():
                # DEGRADED now, or ACTIVE again: its children see the change of state too.
                await self._safely(self.own.publish_status(presence=True))
            await self._reconcile()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = next_heartbeat(next_beat, now, interval)
                await self._heartbeat()

    async def _heartbeat(self) -> None:
        if not self.own.online():
            return
        metrics = await self.own.heartbeat()
        await self.warroom.heartbeat(metrics)

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
        # A child's commands join or leave this agent's advertisement at once.
        await self._advertise_if_changed()
        await self._reconcile()

    async def _reconcile(self) -> None:
        """Bring the war room in line with the children and links (reconcile.py)."""
        if await self.warroom.reconcile() and self.own.advertisement_stale():
            # A child's hold as misbehaving ran out: its commands come back.
            await self._safely(self.own.publish_status())

    async def _advertise_if_changed(self) -> None:
        if self.own.online() and self.own.advertisement_stale():
            await self._safely(self.own.publish_status())

    async def _safely(self, action: Awaitable[None]) -> None:
        try:
            await action
        except VoxError as exc:
            self._said.log(logging.WARNING, f"{self.config.name}: liveness publish skipped: {exc}")
