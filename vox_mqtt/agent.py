"""VOXAgent: the inbound pipeline, the router, delegation down the tree and request tracking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

from . import topics
from .commands import CommandsMixin
from .errors import InvalidMessage, TopicError, VoxError
from .liveness import Incident, Liveness
from .memory import VOXAgentMemory
from .messages import (
    MAX_MESSAGE_BYTES,
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    CommandError,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
    parse,
)
from .outbound import OutboundMixin
from .roles import Role
from .sitelinks import LinkMap, parse_link_topic
from .status import FleetView
from .tracking import RequestState, RequestTracker, TrackedRequest
from .transport import BrokerSettings, Inbound, Session, Will

__all__ = ["AgentConfig", "VOXAgent"]

log = logging.getLogger("vox_mqtt.agent")


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything one agent knows: itself, its master, its children and its broker."""

    id: UUID
    name: str
    master_id: UUID | None  # None only for the operator's console, the root's master
    master_name: str = "master"
    children: Mapping[UUID, str] = field(default_factory=dict)  # id -> name
    state_dir: Path
    broker: BrokerSettings
    message_source: str = "vox-mqtt"
    publish_status: bool = True
    heartbeat_interval: float = 15.0
    stale_after: float = 3.0  # heartbeat intervals
    max_concurrency: int = 32  # command handlers running at once
    max_intake: int = 256  # inbound messages being recorded/acknowledged at once
    request_timeout: float = 30.0
    resend_initial: float = 1.0
    resend_max: float = 8.0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    disk_alert_percent: float = 95.0  # own host checks that open a war-room incident
    memory_alert_percent: float = 95.0
    observe: Sequence[str] = ()  # extra topic filters (the operator: every status, war room)
    links: LinkMap | None = None  # bridge links to watch in a federated fleet (sitelinks.py)

    @property
    def peers(self) -> frozenset[UUID]:
        """Return the only agents this one may talk to: its master and children."""
        ids = set(self.children)
        if self.master_id is not None:
            ids.add(self.master_id)
        return frozenset(ids)


Listener = Callable[[VOXMessage], Awaitable[None] | None]


class VOXAgent(CommandsMixin, OutboundMixin):
    """One agent: owns its MQTT session, its ledger and its roles for an `async with` block."""

    def __init__(
        self,
        config: AgentConfig,
        roles: Iterable[Role] = (),
        *,
        on_request_change: Callable[[TrackedRequest, RequestState, RequestState], None]
        | None = None,
    ) -> None:
        self.config = config
        self.id = config.id
        self.name = config.name
        # No commit window: batches form by themselves while a commit runs, and a window
        # would only add latency to every hop.
        self.memory = VOXAgentMemory(Path(config.state_dir) / "logs.db", commit_window=0)
        self.tracker = RequestTracker(on_change=on_request_change)
        self.fleet_view = FleetView(stale_after=config.stale_after)
        for child_id, child_name in config.children.items():
            self.fleet_view.watch(child_id, child_name)
        # The seed's router: every route name -> the roles that serve it.
        self.event_router: dict[str, list[Role]] = {}
        self.commands: set[str] = set()
        self.events: set[str] = set()
        self.roles: list[Role] = []
        self.listeners: list[Listener] = []  # see every verified inbound message
        self.session: Session | None = None
        self.stopping = False
        self._stack = AsyncExitStack()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handler_slots = asyncio.Semaphore(config.max_concurrency)
        self._intake_slots = asyncio.Semaphore(config.max_intake)
        self._in_progress: dict[UUID, asyncio.Event] = {}
        self._delegated: dict[UUID, int] = {}  # child id -> requests in flight
        self._running_handlers = 0
        self._serving: dict[UUID, VOXMessage] = {}  # command requests being answered
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop_requested = asyncio.Event()
        self._liveness: Liveness | None = None
        self._interrupted: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._unsent: list[tuple[str, str, bytes]] = []
        for role in roles:
            self.add_role(role)

    # --- roles and routes -----------------------------------------------------------------

    def add_role(self, role: Role) -> None:
        """Mount a role: its commands and events join the router."""
        role.bind(self)
        self.roles.append(role)
        self._register_role_routes(role)

    def _register_role_routes(self, role: Role) -> None:
        handlers = role._handlers
        command_names = set(role.get_commands().keys())
        for route_name in handlers:
            if route_name in command_names:
                self.commands.add(route_name)
            else:
                self.events.add(route_name)
            routes = self.event_router.setdefault(route_name, [])
            if role not in routes:
                routes.append(role)

    @property
    def in_flight(self) -> int:
        """Return how many commands this agent is answering right now."""
        return self._running_handlers

    @property
    def epoch(self) -> int:
        """Return the epoch of the current (or last) broker connection."""
        return self._liveness.epoch if self._liveness is not None else 0

    @property
    def incidents(self) -> list[Incident]:
        """Return the open war-room incidents this agent has seen (root and operator read them)."""
        return [] if self._liveness is None else list(self._liveness.incidents.values())

    def advertised_commands(self) -> list[str]:
        """Return what this agent can serve: its own commands and its healthy children's."""
        return sorted(self.commands | self.fleet_view.commands_of(self.config.children))

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> VOXAgent:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _start(self) -> None:
        Path(self.config.state_dir).mkdir(parents=True, exist_ok=True)
        await self.memory.init_db()
        self._stack.push_async_callback(self.memory.close)
        self._liveness = Liveness(self)
        # Read before connecting: anything recorded after this is this run's own work.
        self._interrupted = await self.memory.interrupted_commands()
        self._pending = await self.memory.pending_commands()
        self._unsent = await self.memory.pending_outbox()
        subscriptions = [topics.inbox_filter(self.id)]
        subscriptions += [topics.status(peer) for peer in sorted(self.config.peers)]
        if self.config.publish_status:
            # Our own status too: a late will of an older session landing there is
            # answered with our birth at once (see Liveness._on_own_status).
            subscriptions.append(topics.status(self.id))
        subscriptions += list(self.config.observe)
        subscriptions += [] if self.config.links is None else self.config.links.topics
        self.session = Session(
            self.config.broker,
            subscriptions=subscriptions,
            will=self._will,
            on_connect=self._on_connect,
        )
        await self._stack.enter_async_context(self.session)
        self._spawn(self._inbound_loop(), "inbound")
        self._spawn(self._liveness.run(), "liveness")
        self._spawn(self._resume(), "resume")
        for role in self.roles:
            await role.start()
            self._spawn(role.run(), f"role-{role.name}")

    def _will(self) -> Will | None:
        return self._liveness.will() if self._liveness is not None else None

    async def _on_connect(self) -> None:
        if self._liveness is not None:
            await self._liveness.on_connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop: refuse new commands, let in-flight ones finish within grace, say SHUTDOWN."""
        if self.stopping:
            return
        self.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        if not self._idle.is_set():
            await self._answer_unfinished_shutting_down()
        for role in self.roles:
            with contextlib.suppress(Exception):
                await role.stop()
        if self._liveness is not None and self.session is not None and self.session.connected:
            with contextlib.suppress(VoxError, TimeoutError):
                await self._liveness.publish_shutdown()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        await self._stack.aclose()

    async def serve_forever(self) -> None:
        """Wait until the agent is asked to stop."""
        await self._stop_requested.wait()

    def request_stop(self) -> None:
        """Ask serve_forever to return (e.g. from a signal handler)."""
        self._stop_requested.set()

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed: %r", self.name, task.get_name(), task.exception())

    # --- inbound pipeline -----------------------------------------------------------------

    async def _inbound_loop(self) -> None:
        assert self.session is not None
        async for inbound in self.session.messages():
            if self.config.links is not None and parse_link_topic(inbound.topic) is not None:
                assert self._liveness is not None
                self._liveness.on_link(inbound)
                continue
            try:
                topic = topics.parse_topic(inbound.topic)
            except TopicError as exc:
                log.warning("%s: ignoring %s", self.name, exc)
                continue
            if isinstance(topic, topics.StatusTopic | topics.WarroomTopic):
                assert self._liveness is not None
                await self._liveness.on_observed(inbound, topic)
            else:
                await self._intake_slots.acquire()
                self._spawn(self._intake(inbound, topic), "intake")

    async def _intake(self, inbound: Inbound, topic: topics.InboxTopic) -> None:
        try:
            await self._process(inbound, topic)
        except Exception:
            # Nothing a peer sends may stop the agent: log it and go on.
            log.exception("%s: failed to process a message on %s", self.name, inbound.topic)
        finally:
            self._intake_slots.release()

    async def _process(self, inbound: Inbound, topic: topics.InboxTopic) -> None:
        try:
            message = parse(inbound.payload, max_bytes=self.config.max_message_bytes)
        except InvalidMessage as exc:
            await self._reject_unparsable(inbound, topic, exc)
            return
        problem = self._verify(message, topic)
        if problem is not None:
            log.warning(
                "%s: rejected %s from %s: %s", self.name, message.type, topic.source, problem
            )
            await self.memory.record_message(
                message,
                "rejected",
                outcome=ErrorCode.UNAUTHORIZED_SOURCE,
                reason=problem,
                topic=inbound.topic,
            )
            if topic.source in self.config.peers and message.type != MSG_ACKNOWLEDGED:
                await self._send_error_to(
                    topic.source, message.message_id, ErrorCode.UNAUTHORIZED_SOURCE, problem
                )
            return
        message_id = message.message_id
        # QoS 1 and our own re-sends deliver duplicates: re-ack, never re-execute. The
        # in-progress map is checked and filled with no await between, so two copies
        # arriving together cannot both pass the ledger check; a copy of a message still
        # being recorded waits for that record, so no ack ever precedes durability.
        recording = self._in_progress.get(message_id)
        if recording is not None:
            await recording.wait()
            if not await self.memory.has_message(message_id):
                return  # the first copy failed to record; the sender will re-send
            duplicate = True
        else:
            recording = self._in_progress[message_id] = asyncio.Event()
            try:
                duplicate = await self.memory.has_message(message_id)
                if not duplicate:
                    await self.memory.record_message(message, "received", topic=inbound.topic)
            finally:
                del self._in_progress[message_id]
                recording.set()
        if duplicate:
            await self.memory.record_message(message, "duplicate", topic=inbound.topic)
            if message.type != MSG_ACKNOWLEDGED:
                await self._publish_ack(message)
            return
        if message.type != MSG_ACKNOWLEDGED:
            # The record is durable, so the ack may go; routing need not wait for the ack's own
            # ledger row and PUBACK (two sqlite commits and a broker round trip per hop).
            self._spawn(self._publish_ack(message), "ack")
        await self._route(message)

    def _verify(self, message: VOXMessage, topic: topics.InboxTopic) -> str | None:
        """Return why a message may not be accepted, or None (DESIGN section 3)."""
        if topic.target != self.id:
            return f"arrived on another agent's inbox ({topic.target})"
        if message.source != topic.source:
            return f"source {message.source} does not match the sender {topic.source}"
        if message.target != self.id:
            return f"target {message.target} is not this agent"
        if message.source not in self.config.peers:
            return f"{message.source} is neither this agent's master nor a child"
        if message.type == MSG_COMMAND_REQUEST and message.source != self.config.master_id:
            # Commands only flow down the tree; a child may report, never command.
            return "command_request from a child: commands come only from the master"
        return None

    async def _reject_unparsable(
        self, inbound: Inbound, topic: topics.InboxTopic, exc: InvalidMessage
    ) -> None:
        log.warning("%s: rejected a message from %s: %s", self.name, topic.source, exc.reason)
        await self.memory.record_rejected(
            inbound.payload,
            exc.reason,
            topic=inbound.topic,
            source=topic.source,
            message_id=exc.message_id,
        )
        # The sender is known from the topic (the broker lets it write only there).
        if topic.source in self.config.peers and exc.message_id is not None:
            await self._send_error_to(
                topic.source, exc.message_id, ErrorCode.INVALID_MESSAGE, exc.reason
            )

    async def _route(self, message: VOXMessage) -> None:
        if message.type == MSG_ACKNOWLEDGED:
            ack = MessageAcknowledged.model_validate(message.details)
            self.tracker.acknowledged(ack.in_response_to)
            return
        for listener in self.listeners:
            outcome = listener(message)
            if outcome is not None:
                await outcome
        if message.type == MSG_COMMAND_REQUEST:
            self._begin_command(message)
            return
        if message.reply_to is not None:
            self._complete(message)
        for role in self.event_router.get(message.type, []):
            if message.type in self.commands:
                continue
            for handler in role._handlers.get(message.type, []):
                self._spawn(self._run_event(handler, message), f"event-{message.type}")

    def _complete(self, reply: VOXMessage) -> None:
        assert reply.reply_to is not None
        if reply.type == MSG_COMMAND_ERROR:
            error = CommandError.model_validate(reply.details)
            self.tracker.failed(reply.reply_to, error.code, error.error, reply)
        else:
            self.tracker.completed(reply.reply_to, reply)

    async def _run_event(self, handler: Callable[..., Awaitable[Any]], message: VOXMessage) -> None:
        try:
            await handler(message)
        except Exception:
            log.exception("%s: %s handler failed", self.name, message.type)
