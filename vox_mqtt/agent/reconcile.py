"""War-room reconciliation: what this agent keeps in the war room, and when it posts.

Its own incident (`raise_own`, `resolve_own`, its host checked at each heartbeat), one
incident per lost child and one per lost bridge link this agent owns, resolved when back;
a loss that may be the echo of our own reconnect is held for its grace (storm.py,
docs/liveness.md). The liveness loop (liveness.py) calls `reconcile` at every tick and
change; the `WarroomPoster` it holds posts what it decides.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.warroompost import WarroomPoster
from vox_mqtt.observe.status import ACTIVE, AgentLiveness, FleetView
from vox_mqtt.observe.warroom import CHILD_MISBEHAVING, HEARTBEAT_STALE, Severity, loss_code
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.sitelinks import SITE_LINK_LOST, SiteLinkDuty
from vox_mqtt.protocol.storm import child_silence, hold_loss

__all__ = ["CATCH_UP", "Reconciler"]

# Messages queued in our persistent session arrive within this many seconds of a reconnect.
CATCH_UP: Final = 2.0


class Reconciler:
    """Keep this agent's war-room incidents: its own, one per lost child or link.

    fleet_view and links: what the children's watch has seen (childwatch.py); epoch: the
    connection's, named in the post about itself; online: connected and publishing
    statuses; safely: runs a post whose refusal or failure is logged, never raised.
    """

    def __init__(
        self,
        ctx: AgentContext,
        *,
        fleet_view: FleetView,
        links: SiteLinkDuty | None,
        epoch: Callable[[], int],
        online: Callable[[], bool],
        safely: Callable[[Awaitable[None]], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.fleet_view = fleet_view
        # What this agent posts to the war room: the reconciler decides when, it posts once.
        self.posts = WarroomPoster(ctx, epoch=epoch)
        self.links = links  # a federated fleet: one site incident for the agents behind
        self._online = online
        self._safely = safely  # a post refused or cut off is logged, never raised
        self.connected_at: float | None = None  # monotonic time of the latest birth
        self._resumed = False  # the broker kept our session: queued old news may follow
        # Our latest reconnect (not the first connection) and the backoff window it came in:
        # what is lost within the grace after it may be the restart's echo (storm.py).
        self._reconnected_at: float | None = None
        self._window = 0.0

    @property
    def config(self) -> AgentConfig:
        return self.ctx.config  # a reload replaces it (VOXAgent._use)

    def connected(self) -> None:
        """Note a new connection: its time, and whether it is a reconnect that kept the session."""
        if self.connected_at is not None:
            self.ctx.metrics.reconnects += 1
            self._reconnected_at = time.monotonic()
            self._window = self.ctx.session.reconnect_window
        self.connected_at = time.monotonic()
        self._resumed = self.ctx.session.session_present

    # --- this agent's own incident -----------------------------------------------------------

    async def raise_own(
        self, error_code: str, description: str, *, severity: Severity = "ERROR"
    ) -> bool:
        """Add a cause to this agent's own incident; False if that cause is already open."""
        return await self.posts.raise_own(error_code, description, severity=severity)

    async def resolve_own(self, error_code: str, description: str) -> bool:
        """Remove a cause from this agent's own incident; False if it was not open."""
        return await self.posts.resolve_own(error_code, description)

    async def heartbeat(self, metrics: dict[str, Any]) -> None:
        """At each heartbeat: the host's figures checked (disk, memory), and every open
        incident re-posted within the replay window (docs/security.md)."""
        await self._safely(self.posts.check_host(metrics))
        await self._safely(self.posts.refresh())

    # --- the children and the links ---------------------------------------------------------

    async def reconcile(self) -> bool:
        """Open an incident per lost child and resolve those that are back (level-triggered).

        Return False when offline or never connected: nothing was decided.
        """
        if not self._online() or self.connected_at is None:
            return False
        since_connect = time.monotonic() - self.connected_at
        # A pass may outlast its connection (each post awaits its PUBACK): what it decided
        # goes out on that connection only, never on the next one (warroompost.py).
        decided_on = self.ctx.session.connection_count
        posted = self.posts.open_codes  # what the war room holds from us, kept current
        for child_id in self.config.children:
            entry = self.fleet_view.get(child_id)
            # A child refused from its very first status is unseen, yet misbehaving.
            if entry is None or not (entry.seen or entry.misbehaving()):
                continue
            code = loss_code(entry)
            interval, stale_after = entry.heartbeat_interval, self.config.stale_after
            grace = max(stale_after * interval, self.config.broker.reconnect_max)
            if self.links is not None and self.links.holds(child_id, entry.received_at, grace):
                continue  # the site's one SITE_LINK_LOST incident stands for it
            name = entry.name or str(child_id)
            # A status out of bounds is its own incident, even on top of a loss (an
            # attacker's connection takes the child's session over): say so, once.
            replace = code == CHILD_MISBEHAVING and posted.get(child_id) not in (None, code)
            if code is not None and (child_id not in posted or replace):
                # Retained or queued for us while we were away, or seen on our connection
                # before this one (the wills a stopping broker sends just before it closes
                # ours): old news, while a child that is fine is reborn (storm.py).
                queued = self._resumed and entry.received_at < self.connected_at + CATCH_UP
                earlier = self._reconnected_at is not None and code != CHILD_MISBEHAVING
                earlier = earlier and 0 < entry.received_at < self.connected_at
                silence = child_silence(interval, stale_after, self.config.broker.reconnect_max)
                if (entry.retained or queued or earlier) and since_connect < silence:
                    continue  # an incident it would replace stays open, still ours to resolve
                if code != CHILD_MISBEHAVING and self._echo(entry, code, silence):
                    continue  # posted if the child is not back when the grace ends
                if code == CHILD_MISBEHAVING:
                    why = f"child {name} misbehaves ({entry.rejected}); ignored"
                    severity: Severity = "ERROR"
                else:
                    why = f"child {name} is unreachable ({code}, epoch {entry.epoch})"
                    severity = "CRITICAL"
                await self._safely(
                    self.posts.open_incident(
                        child_id,
                        code,
                        why,
                        epoch=entry.epoch,
                        severity=severity,
                        replace=replace,
                        decided_on=decided_on,
                    )
                )
            elif code is None and child_id in posted:
                state = "back" if entry.status == ACTIVE else "stopped (SHUTDOWN)"
                await self._safely(
                    self.posts.resolve_incident(
                        child_id, f"child {name} is {state}, epoch {entry.epoch}"
                    )
                )
        if self.links is not None:
            await self._reconcile_links(self.links)
        for subject in list(posted):
            if self.links is not None and self.links.link(subject) is not None:
                continue
            if subject != self.config.id and subject not in self.config.children:
                await self._safely(self.posts.resolve_incident(subject, "no longer a child"))
        return True

    def _echo(self, entry: AgentLiveness, code: str, silence: float) -> bool:
        """Return whether a child's loss may be the echo of our own reconnect (storm.py):
        a restarted broker restores the wills it sent as it stopped and delivers them
        again after our reconnect, maybe seconds after, while the children are reborn."""
        seen_at = entry.received_at
        if code == HEARTBEAT_STALE:  # seen when it went stale, not when it last spoke
            seen_at += self.config.stale_after * entry.heartbeat_interval
        return self._held(seen_at, silence)

    def _held(self, seen_at: float | None, heard_within: float) -> bool:
        if seen_at is None:
            return False
        return hold_loss(
            now=time.monotonic(),
            seen_at=seen_at,
            reconnected_at=self._reconnected_at,
            window=self._window,
            heard_within=heard_within,
        )

    async def _reconcile_links(self, links: SiteLinkDuty) -> None:
        """Hold one SITE_LINK_LOST incident per lost link this agent owns; resolve it when back."""
        down = {link.id: link for link in links.owned_down()}
        for bridge, link in down.items():
            # A "0" heard within the grace after our own reconnect may be the bridge's will,
            # sent as the upstream stopped and kept for us (retained, queued) (storm.py).
            if bridge not in self.posts.open_codes and not self._held(
                links.down_since(bridge), link.restart_cap
            ):
                description = (
                    f"site {link.site}: the bridge link is down; "
                    f"{len(link.behind)} agent(s) behind it unreachable"
                )
                await self._safely(self.posts.open_incident(bridge, SITE_LINK_LOST, description))
        for subject, code in list(self.posts.open_codes.items()):
            if code == SITE_LINK_LOST and subject not in down and links.known_up(subject):
                known = links.link(subject)
                site = known.site if known is not None else str(subject)
                await self._safely(
                    self.posts.resolve_incident(subject, f"site {site}: the bridge link is back")
                )
