"""War-room reconciliation: what the war room should hold about the children and site links.

One incident per lost child and one per lost bridge link this agent owns, resolved when
back; a loss that may be the echo of our own reconnect is held for its grace (storm.py,
docs/liveness.md). Liveness owns the connection and calls `reconcile` at every tick and
change; the `WarroomPoster` posts what it decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.warroompost import WarroomPoster
from vox_mqtt.observe.status import ACTIVE, AgentLiveness, FleetView
from vox_mqtt.observe.warroom import CHILD_MISBEHAVING, HEARTBEAT_STALE, Severity, loss_code
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.sitelinks import SITE_LINK_LOST, SiteLinkDuty
from vox_mqtt.protocol.storm import child_silence, hold_loss
from vox_mqtt.transport.session import Inbound

__all__ = ["CATCH_UP", "Reconciler"]

log = logging.getLogger("vox_mqtt.liveness")

# Messages queued in our persistent session arrive within this many seconds of a reconnect.
CATCH_UP: Final = 2.0


class Reconciler:
    """Open an incident per lost child or link and resolve those that are back."""

    def __init__(
        self,
        ctx: AgentContext,
        *,
        fleet_view: FleetView,
        posts: WarroomPoster,
        online: Callable[[], bool],
        safely: Callable[[Awaitable[None]], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.fleet_view = fleet_view
        self.posts = posts
        self._online = online  # connected and publishing statuses (Liveness)
        self._safely = safely  # a post refused or cut off is logged, never raised
        self.connected_at: float | None = None  # monotonic time of the latest birth
        self._resumed = False  # the broker kept our session: queued old news may follow
        # Our latest reconnect (not the first connection) and the backoff window it came in:
        # what is lost within the grace after it may be the restart's echo (storm.py).
        self._reconnected_at: float | None = None
        self._window = 0.0
        # A federated fleet: children behind a lost bridge are one site incident, not many.
        links = ctx.config.links
        self.links = None if links is None else SiteLinkDuty(links)

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

    def on_link(self, inbound: Inbound) -> None:
        """Take a bridge link's state (docs/federation.md); the next reconcile acts on it."""
        change = None if self.links is None else self.links.take(inbound.topic, inbound.payload)
        if change is not None:
            link, up = change
            state = "up" if up else "DOWN"
            log.warning("%s: the bridge link of site %s is %s", self.config.name, link.site, state)

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
