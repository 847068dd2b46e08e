"""What an agent learns of the agents it watches: statuses, ledger heads, site links, posts.

Statuses and war-room posts are taken through the observe package's intake
(`observe/statusintake.py`), the one a look takes them through too; here is only what an agent
adds: its children's names and master from its own config (F26, docs/security.md), a
child's ledger head witnessed in its own ledger (docs/ledger.md, the witness), the state
of its bridge links (docs/federation.md), and each change of a watched agent queued for the
liveness loop (liveness.py) to react to.
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.ledger.witness import HeadWitness
from vox_mqtt.observe.status import INACTIVE, SHUTDOWN, AgentLiveness, FleetView, FleetWord
from vox_mqtt.observe.statusintake import Refusal, StatusIntake
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import VOXMessage
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.signing import STALE as REFUSED_STALE
from vox_mqtt.protocol.sitelinks import SiteLinkDuty
from vox_mqtt.transport.session import Inbound

__all__ = ["ChildrenWatch", "fleet_word", "master_of", "named"]

log = logging.getLogger("vox_mqtt.liveness")

Change = tuple[AgentLiveness, str, str]  # the agent, its state before, its state now


def fleet_word(config: AgentConfig, agent_id: UUID) -> FleetWord | None:
    """Return an agent's name and master as our config or signed bundle says (F26).

    A child's from the config; anyone else's from the bundle's roster (the operator's
    console knows every agent's), None when neither says.
    """
    name = config.children.get(agent_id)
    if name is not None:
        return FleetWord(name=name, master=config.id)
    signing = config.broker.signing
    known = None if signing is None or signing.mode == "off" else signing.roster.get(agent_id)
    return None if known is None else FleetWord(name=known[0], master=known[1])


def named(config: AgentConfig, name: str) -> UUID | None:
    """Return whose a name is among the identities we know (F26): ourselves, our master,
    our children, and whoever our signed bundle names."""
    if name == config.name:
        return config.id
    if name == config.master_name and config.master_id is not None:
        return config.master_id
    for child, child_name in config.children.items():
        if child_name == name:
            return child
    signing = config.broker.signing
    if signing is not None and signing.mode != "off":
        for peer, (peer_name, _) in signing.roster.items():
            if peer_name == name:
                return peer
    return None


def master_of(config: AgentConfig, agent_id: UUID, seen: FleetView) -> UUID | None:
    """Return an agent's master as this agent knows it: the config's, then the statuses'."""
    if agent_id == config.id:
        return config.master_id
    if agent_id in config.children:
        return config.id
    entry = seen.get(agent_id)
    return None if entry is None else entry.master_id


class ChildrenWatch:
    """Take what the agents this one watches publish, and queue each change of their state.

    take: a status or war-room delivery (returns the status it carried, our own included);
    on_link: a bridge link's state; next_change: the next change to react to.
    """

    def __init__(self, ctx: AgentContext, fleet_view: FleetView) -> None:
        self.ctx = ctx
        self.fleet_view = fleet_view
        # Our children's names and master are the config's, never their statuses' (F26); a
        # signed status older than the replay window is no sign of life (F23): the intake.
        fleet_view.fleet_word = lambda agent: fleet_word(self.config, agent)
        fleet_view.named = lambda name: named(self.config, name)
        self.intake = StatusIntake(
            fleet_view,
            signing=lambda: self.config.broker.signing,  # a reload may change the window
            master_of=lambda agent: master_of(self.config, agent, fleet_view),
            own=ctx.config.id,
        )
        self.intake.on_refused = self._refused
        self._changes: asyncio.Queue[Change] = asyncio.Queue()
        self._waiter: asyncio.Future[None] | None = None  # the idle loop, woken by a change
        fleet_view.add_listener(self._queue_change)
        fleet_view.add_reject_listener(self._queue_reject)
        # Each child's ledger head goes into our own ledger (docs/ledger.md, the witness).
        self._witness = HeadWitness(ctx.ledger, on_skip=self._witness_skipped)
        # A federated fleet: children behind a lost bridge are one site incident, not many.
        links = ctx.config.links
        self.links = None if links is None else SiteLinkDuty(links)

    @property
    def config(self) -> AgentConfig:
        return self.ctx.config  # a reload replaces it (VOXAgent._use)

    @property
    def incidents(self) -> dict[tuple[UUID, UUID], Incident]:
        """Return the incidents open in the war room, as this agent has seen them."""
        return self.intake.incidents

    # --- what is delivered ------------------------------------------------------------------

    def take(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> VOXMessage | None:
        """Take a status or war-room message; return the status it carried, if any.

        Our own status is returned and not taken (the liveness loop answers it); a child's
        full status brings its ledger head, witnessed in our ledger.
        """
        message = self.intake.take(inbound, topic)
        if message is None or not isinstance(topic, topics.StatusTopic):
            return message
        entry = self.fleet_view.get(topic.agent)
        if (
            topic.agent in self.config.children
            and not topic.presence  # the head comes with the full status only
            and entry is not None
            and entry.ledger_head
        ):
            final = entry.status == INACTIVE and entry.error_code == SHUTDOWN
            # Its own commit, off the path that reads the session's messages.
            self.ctx.tasks.spawn(
                self._witness_head(entry.id, entry.ledger_head, final=final), "witness"
            )
        return message

    def on_link(self, inbound: Inbound) -> None:
        """Take a bridge link's state (docs/federation.md); the next reconcile acts on it."""
        change = None if self.links is None else self.links.take(inbound.topic, inbound.payload)
        if change is not None:
            link, up = change
            state = "up" if up else "DOWN"
            log.warning("%s: the bridge link of site %s is %s", self.config.name, link.site, state)

    def _refused(self, refusal: Refusal) -> None:
        """Count and tell what the intake did not take (docs/security.md)."""
        name = self.config.name
        if refusal.kind == "forged":
            self.ctx.metrics.rejected.inc(refusal.reason)
        elif refusal.kind == "dropped":
            log.warning("%s: war room: dropped a post: %s", name, refusal.problem)
        elif refusal.reason == REFUSED_STALE:  # a replay older than the window: refused
            self.ctx.metrics.rejected.inc(REFUSED_STALE)
            log.warning("%s: war room: refused a post: %s", name, refusal.problem)
        else:  # NOT_NEWER: a copy of what we hold, ignored
            log.info("%s: war room: ignored a post: %s", name, refusal.problem)

    # --- the witness ------------------------------------------------------------------------

    def _witness_skipped(self) -> None:
        # A child's head that came faster than the witness records (docs/liveness.md).
        self.ctx.metrics.witness_skipped += 1

    async def _witness_head(self, child: UUID, head: tuple[int, str], *, final: bool) -> None:
        try:
            await self._witness.saw(child, head, final=final)
        except LedgerError as exc:
            log.warning("%s: a child's ledger head not recorded: %s", self.config.name, exc)

    # --- changes, for the loop --------------------------------------------------------------

    async def next_change(self, tick: float) -> Change | None:
        """Return the next change of a watched agent, or None after tick seconds without one.

        A plain timer and future, not a timeout that cancels a queue's get: an idle tick
        of every agent a process hosts (a thousand a second) raises no exception.
        """
        if self._changes.empty():
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(tick, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return None if self._changes.empty() else self._changes.get_nowait()

    def _queue_change(self, entry: AgentLiveness, old: str, new: str) -> None:
        self._changes.put_nowait((entry, old, new))
        if self._waiter is not None:
            _wake(self._waiter)

    def _queue_reject(self, entry: AgentLiveness, reason: str) -> None:
        who = entry.name or entry.id
        log.warning("%s: holds %s as misbehaving: %s", self.config.name, who, reason)
        # Not a change of state, but the agent now gets no work: react as to one.
        self._queue_change(entry, entry.status, entry.status)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
