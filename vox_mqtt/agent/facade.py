"""VOXAgent: builds an agent's parts, runs their lifecycle and offers the agent's public API.

The parts and how one command flows through them are described in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

from vox_mqtt.agent.childbudget import ChildBudgets
from vox_mqtt.agent.context import AgentContext, TaskSet
from vox_mqtt.agent.eventreader import RequestEventReader
from vox_mqtt.agent.forgedtraffic import ForgedTraffic
from vox_mqtt.agent.forward import Forward
from vox_mqtt.agent.inbound import InboundPipeline, Listener
from vox_mqtt.agent.lifecycle import Lifecycle
from vox_mqtt.agent.liveness import Liveness
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.progress import ProgressReporter
from vox_mqtt.agent.requests import Requests
from vox_mqtt.agent.roles import Role
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import advertised_params, advertisement, child_share, down_commands
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.agent.tracking import RequestTracker, SentState, TrackedRequest
from vox_mqtt.ledger.privatefs import private_dir
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.status import ACTIVE, RETIRED, AgentLiveness, FleetView
from vox_mqtt.observe.warroom import Incident, Severity
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.messages import MAX_ADVERTISED_COMMANDS, ErrorCode
from vox_mqtt.protocol.settings import AgentConfig, Will
from vox_mqtt.protocol.signing import FORGED_TRAFFIC, Signing
from vox_mqtt.transport.session import Inbound, Session

__all__ = ["AgentConfig", "VOXAgent"]

log = logging.getLogger("vox_mqtt.agent")

# How long a stop waits for the broker to acknowledge the SHUTDOWN status: a frozen broker
# would hold it for publish_timeout. Past it the stop goes on (the session's close is bounded
# too): the SHUTDOWN went out before the DISCONNECT, and if the DISCONNECT does not leave
# either, the will speaks (docs/liveness.md, graceful stop).
_SHUTDOWN_BOUND = 0.5


class VOXAgent:
    """One agent: owns its MQTT session, its ledger and its roles for an `async with` block."""

    def __init__(
        self,
        config: AgentConfig,
        roles: Iterable[Role] = (),
        *,
        on_request_change: Callable[[TrackedRequest, SentState, SentState], None] | None = None,
    ) -> None:
        self.id = config.id
        self.name = config.name
        # No commit window: batches form by themselves while a commit runs, and a window
        # would only add latency to every hop.
        self.memory = VOXAgentMemory(
            Path(config.state_dir) / "logs.db",
            commit_window=0,
            sync=config.ledger_sync,
            clear_sources=config.ledger_clear_sources,
        )
        # Every move of a request sent or served is an event on the tracker's queue, read in
        # order by one task (agent/eventreader.py, the `request-events` task).
        self.tracker = RequestTracker()
        # The one owner of every request sent or served; the tracker is its view of the sent.
        self.requests = Requests(self.tracker)
        self.fleet_view = FleetView(stale_after=config.stale_after)
        self.fleet_view.share_of = self._child_share
        for child_id, child_name in config.children.items():
            self.fleet_view.watch(child_id, child_name)
        self.metrics = AgentMetrics(enabled=config.metrics)
        if config.metrics:
            self.memory.on_commit = self._count_commit
            self.metrics.gauge("ledger_bytes", self._ledger_bytes)
        self._liveness: Liveness | None = None  # built at start: it reads the state dir
        # Built now, connected at start: no part ever finds it missing.
        self._session = Session(
            config.broker,
            subscriptions=self._subscriptions(config),
            will=self._will,
            on_connect=self._on_connect,
        )
        self._session.on_forgery = self._forged  # docs/security.md
        self._session.on_rotation_explained = self._rotation_explained
        self._session.on_unsigned = self._count_unsigned
        self._ctx = AgentContext(
            config=config,
            ledger=self.memory,
            tracker=self.tracker,
            tasks=TaskSet(config.name),
            session=self._session,
            metrics=self.metrics,
            commands_down=self.commands_down,
        )
        self.router = Router()
        # Each child's event rate and backlog, read by the pipeline and the outbox (F25).
        self._budgets = ChildBudgets()
        self._outbox = Outbox(
            settings=lambda: self.config,
            ledger=self.memory,
            publisher=self._session,
            tracker=self.tracker,
            metrics=self.metrics,
            tasks=self._ctx.tasks,
            props=self._ctx.publish_props,
            budgets=self._budgets,
        )
        self._runner = CommandRunner(
            settings=lambda: self.config,
            ledger=self.memory,
            metrics=self.metrics,
            tasks=self._ctx.tasks,
            outbox=self._outbox,
            router=self.router,
            fleet_view=self.fleet_view,
            requests=self.requests,
        )
        self._lifecycle = Lifecycle(
            settings=lambda: self.config,
            ledger=self.memory,
            publisher=self._session,
            props=self._ctx.publish_props,
            outbox=self._outbox,
            requests=self.requests,
            metrics=self.metrics,
            tasks=self._ctx.tasks,
        )
        self._progress = self._lifecycle.reporter  # a handler's progress(), forwarded
        self._event_reader = RequestEventReader(
            self.requests.events,
            name=config.name,
            reporter=self._lifecycle.reporter,
            followers=self._lifecycle.followers,
            metrics=self.metrics,
            on_request_change=on_request_change,
        )
        self._inbound = InboundPipeline(
            settings=lambda: self.config,
            ledger=self.memory,
            session=self._session,
            tracker=self.tracker,
            metrics=self.metrics,
            tasks=self._ctx.tasks,
            outbox=self._outbox,
            runner=self._runner,
            lifecycle=self._lifecycle,
            router=self.router,
            observed=self._observed,
            linked=self._linked,
            budgets=self._budgets,
            # A child over its limits is held as misbehaving: a war-room incident, no work
            # for a while (docs/security.md, F25; docs/liveness.md).
            flooding=self.fleet_view.misbehaved,
        )
        # A peer born (ACTIVE) is there: what the outbox held back for it goes now (F25).
        self.fleet_view.add_listener(self._peer_back)
        self._cut_advertisement = 0  # how many child commands the last cut warned about
        self._cut_params = 0  # how many commands' schemas the last status left out
        self._stack = AsyncExitStack()
        self._children_lock = asyncio.Lock()
        self._stop_requested = asyncio.Event()
        self._stopped = False
        self._started = False  # connected once (the war room needs a live session)
        self._forgery = ForgedTraffic()  # the FORGED_TRAFFIC incident (agent/forgedtraffic.py)
        for role in roles:
            self.add_role(role)

    def _peer_back(self, entry: AgentLiveness, old: str, new: str) -> None:
        if new == ACTIVE and old != ACTIVE:
            self._outbox.deliveries.heard_from(entry.id, back=True)

    def _count_commit(self, records: int, seconds: float) -> None:
        self.metrics.ledger_records += records
        self.metrics.ledger_commit_seconds.observe(seconds)

    def _ledger_bytes(self) -> float:
        # The write-ahead log holds the newest records until a checkpoint: count it too.
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(f"{self.memory.path}{suffix}").st_size
        return float(total)

    # --- what the parts hold, as the agent's public view ----------------------------------

    @property
    def ledger(self) -> VOXAgentMemory:
        """Return this agent's ledger."""
        return self.memory

    @property
    def session(self) -> Session:
        """Return the agent's MQTT session (connected while the agent runs)."""
        return self._session

    @property
    def listeners(self) -> list[Listener]:
        """Return the callbacks that see every verified inbound message (append to add one)."""
        return self._inbound.listeners

    @property
    def roles(self) -> list[Role]:
        """Return the mounted roles."""
        return self.router.roles

    @property
    def commands(self) -> set[str]:
        """Return the commands this agent's own roles serve."""
        return self.router.commands

    @property
    def events(self) -> set[str]:
        """Return the event types this agent's roles handle."""
        return self.router.events

    @property
    def event_router(self) -> dict[str, list[Role]]:
        """Return the seed's router: every route name -> the roles that serve it."""
        return self.router.routes

    @property
    def stopping(self) -> bool:
        """Return whether the agent is stopping (new commands are refused)."""
        return self._runner.stopping

    @property
    def in_flight(self) -> int:
        """Return how many commands this agent is answering right now."""
        return self._runner.in_flight

    @property
    def epoch(self) -> int:
        """Return the epoch of the current (or last) broker connection."""
        return self._liveness.epoch if self._liveness is not None else 0

    @property
    def incidents(self) -> list[Incident]:
        """Return the open war-room incidents this agent has seen (root and operator read them)."""
        return [] if self._liveness is None else list(self._liveness.incidents.values())

    def add_role(self, role: Role) -> None:
        """Mount a role: its commands and events join the router."""
        role.bind(self)
        self.router.mount(role)

    def advertised_commands(self) -> list[str]:
        """Return what this agent can serve: its own commands and its healthy children's.

        At most MAX_ADVERTISED_COMMANDS, its own first; each child within its share
        (`rules.child_share`: a child advertising more is held as misbehaving), and when
        they still do not fit, each child keeps an equal part (docs/liveness.md).
        """
        own = self.router.commands
        offered = self.fleet_view.commands_by(self.config.children)
        chosen, cut = advertisement(own, offered, MAX_ADVERTISED_COMMANDS)
        if cut and self._cut_advertisement != cut:
            self._cut_advertisement = cut
            log.warning(
                "%s: children offer %d more commands than fit in the advertisement (limit %d)",
                self.name,
                cut,
                MAX_ADVERTISED_COMMANDS,
            )
        return chosen

    def advertised_params(self, chosen: list[str]) -> dict[str, dict[str, Any]]:
        """Return what each advertised command takes ({"doc", "schema"}), own and children's.

        A child's entries come from its status, for the commands it advertises; within
        PARAMS_BUDGET in all (`rules.advertised_params`, docs/liveness.md).
        """
        children = {}
        for child in self.config.children:
            entry = self.fleet_view.get(child)
            if entry is not None and entry.healthy:
                children[child] = entry.params
        params, cut = advertised_params(chosen, self.router.specs, children)
        if cut and self._cut_params != cut:
            self._cut_params = cut
            log.warning("%s: %d commands' schemas do not fit in the status", self.name, cut)
        return params

    def commands_down(self) -> list[str]:
        """Return what agents below served while ACTIVE and none ACTIVE serves now.

        Its master answers TARGET_INACTIVE for these, not NO_ROUTE (`rules.down_commands`,
        docs/liveness.md); never one this agent advertises.
        """
        children = [self.fleet_view.get(c) for c in self.config.children]
        return down_commands(children, self.advertised_commands(), MAX_ADVERTISED_COMMANDS)

    def _child_share(self, agent_id: UUID) -> int | None:
        """Return how many commands a child may advertise; None for an agent not a child."""
        children = self.config.children
        if agent_id not in children:
            return None
        return child_share(len(self.router.commands), len(children), MAX_ADVERTISED_COMMANDS)

    async def raise_incident(
        self, error_code: str, description: str, *, severity: Severity = "ERROR"
    ) -> bool:
        """Post an incident about this agent's own work to the war room, once until resolved.

        Return False when one of this error_code is already open (nothing is posted).
        """
        return await self._live().raise_own(error_code, description, severity=severity)

    async def resolve_incident(self, error_code: str, description: str) -> bool:
        """Resolve this agent's own incident of an error_code; False if none was open."""
        return await self._live().resolve_own(error_code, description)

    def _live(self) -> Liveness:
        if self._liveness is None or not self._started:
            raise VoxError(f"{self.name} is not started: it cannot post to the war room")
        return self._liveness

    def choose_child(self, command: str) -> tuple[UUID | None, ErrorCode | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        return self._runner.choose_child(command)

    # --- a change of children while running (a reload) ------------------------------------

    async def update_children(
        self, children: Mapping[UUID, str], *, master_name: str | None = None
    ) -> str:
        """Take new children without reconnecting; return what changed, in one line.

        New children are watched (their status topics subscribed) and routed to once they
        advertise; removed ones stop being routes, their open incidents are resolved (at
        liveness's next tick) and the requests delegated to them are answered
        TARGET_INACTIVE. Nothing in flight elsewhere is touched (docs/operations.md).
        """
        async with self._children_lock:
            old = self.config
            was, now = dict(old.children), dict(children)
            added = {child: name for child, name in now.items() if child not in was}
            removed = {child: name for child, name in was.items() if child not in now}
            renamed = {c: (was[c], n) for c, n in now.items() if c in was and was[c] != n}
            session = self._session
            # First: a refused subscription (a broker not re-rendered yet) changes nothing.
            await session.subscribe([t for child in added for t in topics.child_liveness(child)])
            for child, name in now.items():
                self.fleet_view.watch(child, name).name = name
            self._use(replace(old, children=now, master_name=master_name or old.master_name))
            for child, name in removed.items():
                self.fleet_view.forget(child)
                self._fail_delegated(child, name)
            await session.unsubscribe([t for c in removed for t in topics.child_liveness(c)])
            if self._liveness is not None and session.connected:
                with contextlib.suppress(VoxError):
                    await self._liveness.publish_status()  # the new advertisement, now
            parts = [f"+{name}" for name in sorted(added.values())]
            parts += [f"-{name}" for name in sorted(removed.values())]
            parts += [f"{a}->{b}" for a, b in sorted(renamed.values())]
            text = f"children {' '.join(parts)}" if parts else ""
            if master_name is not None and master_name != old.master_name:
                text += ("; " if text else "") + f"master renamed {master_name!r}"
            if text:
                log.info("%s: %s", self.name, text)
            return text

    def update_secret(self, password: str) -> None:
        """Use a new broker secret from the next connection on (a re-key); stay connected.

        The broker reload that re-keys this identity drops the current connection, and the
        session's next one logs in with the new secret (docs/operations.md).
        """
        self._use(replace(self.config, broker=replace(self.config.broker, password=password)))
        self._session.use_password(password)

    def update_signing(self, signing: Signing | None) -> bool:
        """Sign and verify with new keys at once (a rotation, docs/security.md).

        Return whether the session reconnects once: its own key is new, and so must the
        signature of its will be (Session.use_signing); otherwise it stays connected.
        """
        self._use(replace(self.config, broker=replace(self.config.broker, signing=signing)))
        return self._session.use_signing(signing)

    @property
    def config(self) -> AgentConfig:
        """This agent's config as it stands: the context's, the one cell a reload replaces."""
        return self._ctx.config

    def _use(self, config: AgentConfig) -> None:
        """Put the new config in the context's cell; every part reads it from there."""
        self._ctx.config = config

    def _fail_delegated(self, child: UUID, name: str) -> None:
        """Answer the requests waiting on a child that is no longer one.

        Each ends failed through the outbox, so its row and its leaving the outbox are one
        commit: after a restart nothing re-sends it to the former child (docs/ledger.md).
        """
        reason = f"{name} is no longer a child of {self.name} (the fleet changed)"
        for tracked in self.tracker.pending():
            if tracked.message.target == child and tracked.expects_reply:
                ending = self._outbox.deliveries.end(
                    tracked, SentState.FAILED, ErrorCode.TARGET_INACTIVE, reason
                )
                self._ctx.tasks.spawn(ending, "fail-delegated")

    def _forget_if_retired(self, child: UUID) -> None:
        """Forget a child that said RETIRED (`vox fleet retire`), in a task of its own."""
        entry = self.fleet_view.get(child)
        if child not in self.config.children or entry is None or entry.error_code != RETIRED:
            return
        log.warning("%s: retired: forgets %s (%s)", self.name, self.config.children[child], child)

        async def forget() -> None:
            await self.update_children(
                {c: n for c, n in self.config.children.items() if c != child}
            )

        self._ctx.tasks.spawn(forget(), "retired")

    # --- sending: the outbox's own methods (agent/outbox.py) ------------------------------

    send_message = Forward("_outbox", Outbox.send_message)
    request = Forward("_outbox", Outbox.request)
    ask = Forward("_outbox", Outbox.ask)
    send = Forward("_outbox", Outbox.send)
    notify_master = Forward("_outbox", Outbox.notify_master)
    reply = Forward("_outbox", Outbox.reply)
    reply_to = Forward("_outbox", Outbox.reply_to)

    # --- a request's life: the lifecycle part's own methods (agent/lifecycle.py) -----------

    request_status = Forward("_lifecycle", Lifecycle.request_status)
    cancel = Forward("_lifecycle", Lifecycle.cancel)
    follow = Forward("_lifecycle", Lifecycle.follow)
    progress = Forward("_progress", ProgressReporter.progress)

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> VOXAgent:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _start(self) -> None:
        private_dir(Path(self.config.state_dir))
        await self.memory.init_db()
        self._stack.push_async_callback(self.memory.close)
        await self._lifecycle.load()  # cancels that came before their requests
        self._liveness = Liveness(
            self._ctx,
            fleet_view=self.fleet_view,
            advertise=self.advertised_commands,
            params=self.advertised_params,
        )
        # Read before connecting: anything recorded after this is this run's own work.
        interrupted = await self.memory.interrupted_commands()
        delegated = await self.memory.delegated_commands()
        pending = await self.memory.pending_commands()
        unsent = await self.memory.pending_outbox()
        # Before connecting, so a child's answer that waited on the broker finds its command.
        adopted = self._runner.adopt(delegated)
        interrupted = [row for row in interrupted if row["message_id"] not in adopted]
        session = self._session
        await self._stack.enter_async_context(session)
        self._started = True
        self.metrics.commands_served.seed(self.router.commands)
        tasks = self._ctx.tasks
        tasks.spawn(self._event_reader.run(), "request-events")
        tasks.spawn(self._inbound.run(), "inbound")
        tasks.spawn(self._liveness.run(), "liveness")
        tasks.spawn(self._resume(session, interrupted, pending, unsent), "resume")
        for role in self.roles:
            await role.start()
            tasks.spawn(role.run(), f"role-{role.name}")

    @staticmethod
    def _subscriptions(config: AgentConfig) -> list[str]:
        """Our inbox; the master's presence, the children's status and presence, our own."""
        subscriptions = [topics.inbox_filter(config.id)]
        subscriptions += topics.liveness_topics(
            config.id, config.master_id, config.children, own=config.publish_status
        )
        # Statuses asked for come with their presences: the state is there (docs/liveness.md).
        subscriptions += topics.with_presences(config.observe)
        subscriptions += [] if config.links is None else config.links.topics
        return subscriptions

    async def _resume(
        self,
        session: Session,
        interrupted: list[dict[str, Any]],
        pending: list[dict[str, Any]],
        unsent: list[tuple[str, str, bytes]],
    ) -> None:
        """After a restart: re-send the outbox, then settle the commands the ledger left open."""
        await session.wait_connected(None)
        self._outbox.redeliver(unsent)
        await self._lifecycle.resume()
        await self._runner.resume(interrupted, pending)

    def _count_unsigned(self) -> None:
        self.metrics.unsigned += 1  # "accept": let through, and counted (docs/security.md)

    def _forged(self, topic: str, problem: str) -> None:
        """Tell the war room, once per window, that traffic on this agent's topics is forged."""
        if self._liveness is None or not self.config.publish_status:
            return
        text = self._forgery.refused(topic, problem, time.monotonic())
        if text is not None:
            post = self._liveness.raise_own(FORGED_TRAFFIC, text, severity="CRITICAL")
            self._ctx.tasks.spawn(post, "forged-traffic")

    def _rotation_explained(self, senders: set[UUID]) -> None:
        """A reload explained refusals as a rotation: no refusal left, the incident ends."""
        if self._liveness is None or not self._forgery.explained(senders):
            return
        why = "the refused messages verify under a rotated key reloaded before this agent"
        post = self._liveness.resolve_own(FORGED_TRAFFIC, f"{why}: not a forgery")
        self._ctx.tasks.spawn(post, "forged-traffic-explained")

    def _will(self) -> Will | None:
        return self._liveness.will() if self._liveness is not None else None

    async def _on_connect(self) -> None:
        if self._liveness is not None:
            await self._liveness.on_connect()
        self._outbox.deliveries.reconnected()

    def _linked(self, inbound: Inbound) -> None:
        if self._liveness is not None:
            self._liveness.on_link(inbound)

    async def _observed(
        self, inbound: Inbound, topic: topics.StatusTopic | topics.WarroomTopic
    ) -> None:
        if self._liveness is not None:
            await self._liveness.on_observed(inbound, topic)
        if isinstance(topic, topics.StatusTopic):
            self._forget_if_retired(topic.agent)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop: refuse new commands, let in-flight ones finish within grace, say SHUTDOWN."""
        if self._stopped:
            return
        self._stopped = True
        await self._runner.drain(grace)
        for role in self.roles:
            with contextlib.suppress(Exception):
                await role.stop()
        await self._inbound.drain(self.config.broker.publish_timeout)
        await self._outbox.acks.flush(self.config.broker.publish_timeout)
        session = self._session
        if self._liveness is not None and session.connected:
            with contextlib.suppress(VoxError, TimeoutError):
                await self._liveness.publish_shutdown(bound=_SHUTDOWN_BOUND)
        self._outbox.deliveries.close()
        await self._ctx.tasks.cancel_all()
        self._event_reader.read_waiting()  # the moves of the stop itself
        await self._stack.aclose()

    async def serve_forever(self) -> None:
        """Wait until the agent is asked to stop."""
        await self._stop_requested.wait()

    def request_stop(self) -> None:
        """Ask serve_forever to return (e.g. from a signal handler)."""
        self._stop_requested.set()
