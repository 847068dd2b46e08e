"""An agent's liveness duties: birth, heartbeats, will, shutdown, watching children."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal
from uuid import UUID

from vox_mqtt._version import __version__
from vox_mqtt.agent.cadence import next_heartbeat
from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.logonce import Repeats
from vox_mqtt.agent.reconcile import CATCH_UP, Reconciler
from vox_mqtt.agent.sendrules import check_size
from vox_mqtt.agent.warroompost import WarroomPoster
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.witness import HeadWitness
from vox_mqtt.observe.observer import expiry_left, read_status
from vox_mqtt.observe.status import (
    ACTIVE,
    DEGRADED,
    INACTIVE,
    LEDGER_UNAVAILABLE,
    SHUTDOWN,
    VM_CONNECTION_LOST,
    WILL_EXPIRY,
    AgentLiveness,
    EpochCounter,
    FleetView,
    FleetWord,
    Timeliness,
    host_metrics,
)
from vox_mqtt.observe.warroom import Incident, Severity, apply_warroom
from vox_mqtt.observe.warroomguard import WarroomGuard
from vox_mqtt.observe.warroomreplay import WarroomOrder
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import LedgerError, VoxError
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    LedgerHead,
    VOXMessage,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.protocol.settings import AgentConfig, Will
from vox_mqtt.protocol.signing import STALE as REFUSED_STALE
from vox_mqtt.transport.session import Inbound

__all__ = ["Liveness"]

log = logging.getLogger("vox_mqtt.liveness")

# What the will says of itself: it is built at connect and published by the broker later,
# so its emitted_at is not the loss's time (docs/liveness.md, "The will's time").
WILL_DETAIL: Final = (
    "will: set at connect (emitted_at); the broker publishes it at death"
    " (its time: the message expiry left, docs/liveness.md)"
)

_STATUS_WORDS: Final[dict[str, Literal["ACTIVE", "DEGRADED"]]] = {
    ACTIVE: "ACTIVE",
    DEGRADED: "DEGRADED",
}


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
        self.advertise = advertise  # the commands this agent offers while ACTIVE
        self.params = params  # what each of them takes (docs/liveness.md, "Parameter schemas")
        self.epoch_counter = EpochCounter(ctx.config.state_dir)
        self.epoch = self.epoch_counter.value
        self.started_at = now_iso()
        # Counts up with every status and presence of this epoch: a watcher ignores one not
        # newer than the last it took (a replay, docs/security.md); the will carries none.
        self.sequence = 0
        self.incidents: dict[tuple[UUID, UUID], Incident] = {}  # seen in the war room
        self.on_incident: Callable[[Incident], None] | None = None  # new posts and resolutions
        self._said = Repeats(log)  # an incident retried at every tick is said once a minute
        # What this agent posts to the war room: it decides when, the poster posts once.
        self.posts = WarroomPoster(ctx, epoch=lambda: self.epoch)
        self._guard = WarroomGuard()  # size, self-or-child rule, rate per source
        self._order = WarroomOrder()  # replayed posts (docs/security.md), window set per post
        self._advertised: list[str] | None = None
        self._changes: asyncio.Queue[tuple[AgentLiveness, str, str]] = asyncio.Queue()
        self._waiter: asyncio.Future[None] | None = None  # the idle run loop, woken by a change
        fleet_view.add_listener(self._queue_change)
        fleet_view.add_reject_listener(self._queue_reject)
        # Our children's names and master are the config's, never their statuses' (F26); a
        # signed status older than the replay window is no sign of life (F23).
        fleet_view.fleet_word = self._fleet_word
        fleet_view.named = self._named
        fleet_view.timeliness = self._timeliness()
        self._own_repeat_at = -float("inf")  # when our status last went out again (F23)
        self._backlog_answered: float | None = None  # the birth whose backlog got its answer
        # Each child's ledger head goes into our own ledger (docs/ledger.md, the witness).
        self._witness = HeadWitness(ctx.ledger, on_skip=self._witness_skipped)
        self._published_failure: str | None = None  # the ledger failure our status names
        self._head_read: tuple[int, tuple[int, str]] | None = None  # (commits then, head)
        # What the war room should hold about the children and site links (reconcile.py).
        self.reconciler = Reconciler(
            ctx,
            fleet_view=fleet_view,
            posts=self.posts,
            online=self._online,
            safely=self._safely,
        )

    @property
    def config(self) -> AgentConfig:
        """The agent's config as it stands: the context's cell, which a reload replaces."""
        return self.ctx.config

    # --- own status -----------------------------------------------------------------------

    def _status_message(
        self,
        status: str,
        error_code: str | None,
        metrics: dict[str, Any] | None = None,
        *,
        head: tuple[int, str] | None = None,
        detail: str | None = None,
        presence: bool = False,
        counted: bool = True,
    ) -> VOXMessage:
        """Return the full status, or (presence) what its children may read of it.

        The presence names no master and no command, and is addressed to the agent itself:
        its children learn only that it is alive, its state and epoch (docs/liveness.md).
        """
        word: Literal["ACTIVE", "INACTIVE", "DEGRADED"] | None
        if presence:
            target = self.config.id
            metrics, head = None, None
            detail = WILL_DETAIL if not counted else None
            word = _STATUS_WORDS.get(status, "INACTIVE")
        else:
            target = self.config.master_id or topics.WARROOM_ID
            # The full status says no state while the agent runs: the presence, which gets
            # the will, is the one topic that tells (docs/liveness.md, "Which topic tells").
            # A stop is its own last word, true for good: it says so.
            word = None if status in _STATUS_WORDS else "INACTIVE"
        serving = status == ACTIVE and not presence
        commands = self.advertise() if serving else []
        report = AgentStatus(
            name=self.config.name,
            status=word,
            error_code=error_code,
            epoch=self.epoch,
            started_at=self.started_at,
            heartbeat_interval=self.config.heartbeat_interval,
            commands=commands,
            commands_down=self.ctx.commands_down() if serving else [],
            version=__version__,
            metrics=metrics or {},
            ledger_head=None if head is None else LedgerHead(row=head[0], hash=head[1]),
            detail=None if detail is None else detail[:300],
            sequence=self._next_sequence() if counted else None,
            params=(self.params(commands) or None) if serving and self.params else None,
        )
        return new_message(
            MSG_AGENT_STATUS,
            source=self.config.id,
            target=target,
            details=report,
            message_source=self.config.message_source,
        )

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def will(self) -> Will | None:
        """Return the will for the next connection, which starts a new epoch."""
        if not self.config.publish_status:
            return None
        self.epoch = self.epoch_counter.next()
        self.sequence = 0
        # One will per connection, on the presence: its children and its master (who reads
        # both topics) learn of the loss alike; the full status keeps its last report.
        # Without a sequence: the broker publishes it after every status of its epoch.
        message = self._status_message(INACTIVE, VM_CONNECTION_LOST, presence=True, counted=False)
        return Will(
            topic=topics.presence(self.config.id),
            payload=serialize(message),
            retain=True,
            user_properties=self.ctx.publish_props.will(MSG_AGENT_STATUS),
            message_expiry=WILL_EXPIRY,  # counted down by the broker from the loss
        )

    async def on_connect(self) -> None:
        """Publish the birth certificate of this connection."""
        self.reconciler.connected()
        if self.config.publish_status:
            await self.publish_status(presence=True)

    async def publish_status(
        self, metrics: dict[str, Any] | None = None, *, presence: bool = False
    ) -> None:
        """Publish the retained ACTIVE status (birth, heartbeat, new advertisement).

        presence: the presence too (birth, heartbeat, a change of state); a new
        advertisement alone changes nothing there.
        """
        if not self.config.publish_status:
            return
        if metrics is None:
            metrics = self._figures()
        failure = self.ctx.ledger.write_failure
        self._published_failure = failure
        head = await self._ledger_head()
        if failure is None:
            state, code, detail = ACTIVE, None, None
        else:
            # It cannot record, so it accepts nothing: its master routes elsewhere.
            state, code, detail = DEGRADED, LEDGER_UNAVAILABLE, f"cannot record: {failure}"
        message = self._status_message(state, code, metrics, head=head, detail=detail)
        self._advertised = list(message.details.get("commands", []))
        await self._publish(message)
        if presence:
            await self._publish(self._status_message(state, code, presence=True), presence=True)

    async def _publish(self, message: VOXMessage, *, presence: bool = False) -> None:
        session = self.ctx.session
        topic = topics.presence(self.config.id) if presence else topics.status(self.config.id)
        await session.publish(
            topic,
            self._checked(message),
            retain=True,
            props=self.ctx.publish_props.own(MSG_AGENT_STATUS),
        )

    async def publish_shutdown(self, bound: float | None = None) -> None:
        """Publish the retained INACTIVE SHUTDOWN status before a graceful disconnect.

        Waits at most `bound` seconds for the broker's acknowledgements: both messages are
        written before that wait starts, so the DISCONNECT that follows goes out behind them
        and a broker that is only slow still stores them first; a frozen one does not hold
        the stop (docs/transport.md, "Closing is bounded").
        """
        if self.config.publish_status:
            # The last counts of this process stay readable after it stops, and its ledger's
            # last head lets its master mark it final (nothing may follow it).
            head = await self._ledger_head()
            sends = [
                asyncio.ensure_future(self._publish(message, presence=presence))
                for message, presence in (
                    (self._status_message(INACTIVE, SHUTDOWN, self._figures(), head=head), False),
                    (self._status_message(INACTIVE, SHUTDOWN, presence=True), True),
                )
            ]
            try:
                done, pending = await asyncio.wait(sends, timeout=bound)
            finally:
                for send in sends:
                    send.cancel()
            for send in done:
                send.result()  # a refusal or a failed delivery is the caller's to hear
            if pending:
                raise TimeoutError(f"no PUBACK for the SHUTDOWN status within {bound:g}s")

    def _checked(self, message: VOXMessage) -> bytes:
        """Serialize, refusing (MessageTooLarge) what the broker would drop us for."""
        check_size(message, payload := serialize(message), self.config.max_message_bytes)
        return payload

    async def _ledger_head(self) -> tuple[int, str] | None:
        # At every heartbeat: from memory when this process committed, or the last read while
        # nothing was committed since (an idle agent writes nothing: docs/ledger.md).
        ledger = self.ctx.ledger
        head = ledger.written_head
        if head is not None:
            return head
        commits = ledger.commit_count
        if self._head_read is not None and self._head_read[0] == commits:
            return self._head_read[1]
        try:
            head = await ledger.head()
        except LedgerError as exc:
            log.warning("%s: ledger head unknown: %s", self.config.name, exc)
            return None
        if ledger.commit_count == commits:
            self._head_read = (commits, head)
        return head

    async def run(self) -> None:
        """Heartbeat, staleness checks and reactions to watched agents, until cancelled."""
        interval = self.config.heartbeat_interval
        tick = max(0.05, min(1.0, interval / 4))
        next_beat = time.monotonic() + interval
        while True:
            change = await self._next_change(tick)
            if change is not None:
                await self._react(*change)
                continue
            self.fleet_view.refresh()
            if self.ctx.ledger.write_failure != self._published_failure and self._online():
                # DEGRADED now, or ACTIVE again: its children see the change of state too.
                await self._safely(self.publish_status(presence=True))
            await self._reconcile()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = next_heartbeat(next_beat, now, interval)
                await self._heartbeat()

    async def _next_change(self, tick: float) -> tuple[AgentLiveness, str, str] | None:
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

    def _figures(self) -> dict[str, Any]:
        """Return the host figures and this agent's metrics for details.metrics."""
        figures = host_metrics(self.config.state_dir)
        snapshot = self.ctx.metrics.snapshot()
        if snapshot is not None:
            figures["agent"] = snapshot
        return figures

    def _advertisement_stale(self) -> bool:
        """Tell whether our published commands differ from what we would publish now."""
        wanted = [] if self.ctx.ledger.write_failure is not None else self.advertise()
        return wanted != self._advertised

    def _online(self) -> bool:
        # While the session is down a publish would wait for it: the birth covers the gap.
        return self.ctx.session.connected and self.config.publish_status

    async def _heartbeat(self) -> None:
        if not self._online():
            return
        if self.ctx.ledger.write_failure is not None:
            # Try a write each beat, to learn when the ledger can record again.
            with contextlib.suppress(LedgerError):
                await self.ctx.ledger.record(
                    "health", LedgerAction.LEDGER_PROBE, self.config.id, None, {}
                )
        metrics = self._figures()
        await self._safely(self.publish_status(metrics, presence=True))
        await self._safely(self.posts.check_host(metrics))
        await self._safely(self.posts.refresh())  # open incidents stay within the window

    async def _safely(self, action: Awaitable[None]) -> None:
        try:
            await action
        except VoxError as exc:
            self._said.log(logging.WARNING, f"{self.config.name}: liveness publish skipped: {exc}")

    # --- watching others ------------------------------------------------------------------

    def _witness_skipped(self) -> None:
        # A child's head that came faster than the witness records (docs/liveness.md).
        self.ctx.metrics.witness_skipped += 1

    async def _witness_head(self, child: UUID, head: tuple[int, str], *, final: bool) -> None:
        try:
            await self._witness.saw(child, head, final=final)
        except LedgerError as exc:
            log.warning("%s: a child's ledger head not recorded: %s", self.config.name, exc)

    def on_link(self, inbound: Inbound) -> None:
        """Take a bridge link's state (docs/federation.md); the next reconcile acts on it."""
        self.reconciler.on_link(inbound)

    def _fleet_word(self, agent_id: UUID) -> FleetWord | None:
        """Return an agent's name and master as our config or signed bundle says (F26).

        A child's from the config; anyone else's from the bundle's roster (the operator's
        console knows every agent's), None when neither says.
        """
        name = self.config.children.get(agent_id)
        if name is not None:
            return FleetWord(name=name, master=self.config.id)
        signing = self.config.broker.signing
        known = None if signing is None or signing.mode == "off" else signing.roster.get(agent_id)
        return None if known is None else FleetWord(name=known[0], master=known[1])

    def _named(self, name: str) -> UUID | None:
        """Return whose a name is among the identities we know (F26): ourselves, our
        master, our children, and whoever our signed bundle names."""
        config = self.config
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

    def _timeliness(self) -> Timeliness | None:
        signing = self.config.broker.signing
        if signing is None or signing.mode == "off":
            return None
        return Timeliness(window=signing.replay_window, skew=signing.clock_skew)

    def _master_of(self, agent_id: UUID) -> UUID | None:
        """Return an agent's master as this agent knows it (config, then statuses)."""
        if agent_id == self.config.id:
            return self.config.master_id
        if agent_id in self.config.children:
            return self.config.id
        entry = self.fleet_view.get(agent_id)
        return None if entry is None else entry.master_id

    def _replayed(self, problem: str) -> None:
        """Count a replayed war-room post: STALE is refused (rejected), NOT_NEWER ignored."""
        reason = problem.partition(":")[0]
        if reason == REFUSED_STALE:
            self.ctx.metrics.rejected.inc(REFUSED_STALE)
            log.warning("%s: war room: refused a post: %s", self.config.name, problem)
        else:
            log.info("%s: war room: ignored a post: %s", self.config.name, problem)

    def _queue_change(self, entry: AgentLiveness, old: str, new: str) -> None:
        self._changes.put_nowait((entry, old, new))
        if self._waiter is not None:
            _wake(self._waiter)

    def _queue_reject(self, entry: AgentLiveness, reason: str) -> None:
        who = entry.name or entry.id
        log.warning("%s: holds %s as misbehaving: %s", self.config.name, who, reason)
        # Not a change of state, but the agent now gets no work: react as to one.
        self._queue_change(entry, entry.status, entry.status)

    async def on_observed(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> None:
        """Take a status or war-room message the session delivered."""
        if inbound.forgery is not None:  # refused by the session (docs/security.md)
            self.ctx.metrics.rejected.inc(inbound.forgery.partition(":")[0])
            return
        if isinstance(topic, topics.WarroomTopic):
            refused = self._guard.refuse(
                topic.source, topic.subject, len(inbound.payload), self._master_of
            )
            if refused is not None:
                log.warning("%s: war room: dropped a post: %s", self.config.name, refused)
                return
            signing = self.config.broker.signing  # a reload may change the window
            if signing is not None:
                self._order.window, self._order.skew = signing.replay_window, signing.clock_skew
            incident = apply_warroom(self.incidents, inbound, topic, self._order)
            if isinstance(incident, str):  # a replay (docs/security.md): never shown
                self._replayed(incident)
            elif incident is not None and not incident.again and self.on_incident is not None:
                self.on_incident(incident)
            return
        message = read_status(inbound, topic)
        if message is None:
            return
        if topic.agent == self.config.id:
            await self._on_own_status(message, retained=inbound.retain)
        else:
            self.fleet_view.timeliness = self._timeliness()  # a reload may change the window
            self.fleet_view.update(
                message,
                retained=inbound.retain,
                presence=topic.presence,
                expiry_left=expiry_left(inbound, message),
            )
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
            if (
                topic.agent in self.config.children
                and self._online()
                and self._advertisement_stale()
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
        now = time.monotonic()
        born = self.reconciler.connected_at
        if born is not None and now < born + CATCH_UP and self._backlog_answered != born:
            # Our persistent session's queue, delivered at connect, may hold our previous
            # session's own will: one answer per connection to that backlog does not spend
            # the replay allowance below, so a late will right after it is still answered.
            self._backlog_answered = born
        elif now - self._own_repeat_at < self.config.heartbeat_interval:
            # A replay of old statuses (F23, docs/security.md) gets one answer per
            # heartbeat interval, not one each: the next beat puts ours back anyway.
            return
        else:
            self._own_repeat_at = now
        log.warning(
            "%s: a status of epoch %d replaced ours (epoch %d): publishing ours again",
            self.config.name,
            epoch,
            self.epoch,
        )
        await self._safely(self.publish_status(presence=True))

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
        if self._online() and self._advertisement_stale():
            # A child's commands join or leave this agent's advertisement at once.
            await self._safely(self.publish_status())
        await self._reconcile()

    async def _reconcile(self) -> None:
        """Bring the war room in line with the children and links (reconcile.py)."""
        if await self.reconciler.reconcile() and self._advertisement_stale():
            # A child's hold as misbehaving ran out: its commands come back.
            await self._safely(self.publish_status())

    # --- the war room (posting is the poster's) --------------------------------------------

    async def raise_own(
        self, error_code: str, description: str, *, severity: Severity = "ERROR"
    ) -> bool:
        """Add a cause to this agent's own incident; False if that cause is already open."""
        return await self.posts.raise_own(error_code, description, severity=severity)

    async def resolve_own(self, error_code: str, description: str) -> bool:
        """Remove a cause from this agent's own incident; False if it was not open."""
        return await self.posts.resolve_own(error_code, description)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
