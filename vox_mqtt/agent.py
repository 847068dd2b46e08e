"""VOXAgent: the inbound pipeline, the router, delegation down the tree and request tracking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from . import topics
from .errors import CommandFailed, DeliveryFailed, InvalidMessage, TopicError, VoxError
from .liveness import Liveness
from .memory import VOXAgentMemory
from .messages import (
    MAX_MESSAGE_BYTES,
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandError,
    CommandRequest,
    CommandResult,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
    new_message,
    parse,
    parse_timestamp,
    serialize,
)
from .roles import ParamsError, Role
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

    @property
    def peers(self) -> frozenset[UUID]:
        """Return the only agents this one may talk to: its master and children."""
        ids = set(self.children)
        if self.master_id is not None:
            ids.add(self.master_id)
        return frozenset(ids)


Listener = Callable[[VOXMessage], Awaitable[None] | None]


class VOXAgent:
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
        subscriptions += list(self.config.observe)
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
            await self._publish_ack(message)
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
            self._running_handlers += 1
            self._idle.clear()
            self._spawn(self._serve_command(message), "command")
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

    # --- commands -------------------------------------------------------------------------

    async def _serve_command(self, request: VOXMessage) -> None:
        try:
            details = await self._answer_command(request)
        except Exception as exc:  # the last line of defence: answer, never crash
            log.exception("%s: command failed", self.name)
            details = CommandError(code=ErrorCode.HANDLER_ERROR, error=f"{type(exc).__name__}")
        finally:
            self._running_handlers -= 1
            if self._running_handlers == 0:
                self._idle.set()
        kind = MSG_COMMAND_RESULT if isinstance(details, CommandResult) else MSG_COMMAND_ERROR
        with contextlib.suppress(VoxError):
            # The reply's "sent" row (with the reply whole in the outbox) is what marks the
            # command finished: from then on a restart re-sends the answer, never re-runs.
            await self.send_message(request.reply(kind, details), expects_reply=False)
            await self.memory.record_message(
                request, "completed" if kind == MSG_COMMAND_RESULT else "failed"
            )

    async def _answer_command(self, request: VOXMessage) -> CommandResult | CommandError:
        payload = CommandRequest.model_validate(request.details)
        name = payload.command
        if self.stopping:
            return CommandError(
                code=ErrorCode.SHUTTING_DOWN, error="agent is stopping", command=name
            )
        timeout = self._timeout_of(payload)
        handler = self._local_handler(name)
        if handler is not None:
            async with self._handler_slots:
                await self.memory.record_message(request, "started")
                return await self._call(handler, name, payload.params, timeout)
        return await self._delegate(request, payload, timeout)

    def _local_handler(self, name: str) -> Callable[..., Awaitable[Any]] | None:
        if name not in self.commands:
            return None
        for role in self.event_router.get(name, []):
            handler = role.get_commands().get(name)
            if handler is not None:
                return handler
        return None

    def _timeout_of(self, payload: CommandRequest) -> float:
        timeout = self.config.request_timeout
        if payload.deadline is not None:
            remaining = parse_timestamp(payload.deadline).timestamp() - time.time()
            timeout = max(0.0, min(timeout, remaining))
        return timeout

    async def _call(
        self,
        handler: Callable[..., Awaitable[Any]],
        name: str,
        params: dict[str, Any],
        timeout: float,
    ) -> CommandResult | CommandError:
        try:
            async with asyncio.timeout(timeout):
                result = await handler(**params)
            result = to_jsonable_python(result)
        except ParamsError as exc:
            return CommandError(code=ErrorCode.INVALID_MESSAGE, error=str(exc), command=name)
        except TimeoutError:
            return CommandError(
                code=ErrorCode.TIMEOUT, error=f"{name} took over {timeout:.1f}s", command=name
            )
        except PydanticSerializationError as exc:
            return CommandError(
                code=ErrorCode.HANDLER_ERROR,
                error=f"{name} returned a result that is not JSON: {exc}",
                command=name,
            )
        except Exception as exc:
            log.exception("%s: command %s raised", self.name, name)
            return CommandError(
                code=ErrorCode.HANDLER_ERROR,
                error=f"{name} failed: {type(exc).__name__}: {exc}"[:500],
                command=name,
            )
        return CommandResult(command=name, result=result, handled_by=self.id)

    def choose_child(self, command: str) -> tuple[UUID | None, str | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        advertising = [
            entry
            for entry in (self.fleet_view.get(c) for c in self.config.children)
            if entry is not None and command in entry.commands
        ]
        healthy = [entry for entry in advertising if entry.healthy]
        if healthy:
            best = min(healthy, key=lambda e: (self._delegated.get(e.id, 0), random.random()))
            return best.id, None
        return None, ErrorCode.TARGET_INACTIVE if advertising else ErrorCode.NO_ROUTE

    async def _delegate(
        self, request: VOXMessage, payload: CommandRequest, timeout: float
    ) -> CommandResult | CommandError:
        name = payload.command
        child, code = self.choose_child(name)
        if child is None:
            reason = (
                f"no child that serves {name!r} is healthy"
                if code == ErrorCode.TARGET_INACTIVE
                else f"{self.name} cannot route {name!r}: neither it nor a child serves it"
            )
            return CommandError(code=code or ErrorCode.NO_ROUTE, error=reason, command=name)
        downstream = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=child,
            details=payload,
            reply_to=request.message_id,
            message_source=self.config.message_source,
        )
        await self.memory.record_message(request, "delegated", outcome=str(child))
        self._delegated[child] = self._delegated.get(child, 0) + 1
        try:
            reply = await self._await_reply(downstream, timeout)
        except CommandFailed as exc:
            return CommandError(code=exc.code, error=exc.error, command=name)
        finally:
            self._delegated[child] -= 1
        result = CommandResult.model_validate(reply.details)
        # The master answers for the work: upstream never learns the child exists.
        return CommandResult(
            command=name, result=result.result, summary=result.summary, handled_by=self.id
        )

    # --- sending --------------------------------------------------------------------------

    async def send_message(self, message: VOXMessage, *, expects_reply: bool) -> TrackedRequest:
        """Record, publish and keep re-sending a message until it is acknowledged."""
        if message.target not in self.config.peers:
            raise VoxError(
                f"{self.name} may only talk to its master and children, not {message.target}"
            )
        tracked = self.tracker.track(message, expects_reply=expects_reply)
        topic = topics.inbox(message.target, self.id)
        # Whole in the outbox until acknowledged: a crash before then re-sends it on restart.
        await self.memory.record_message(message, "sent", outbox=(topic, serialize(message)))
        self._spawn(self._deliver(tracked), "deliver")
        return tracked

    async def _deliver(self, tracked: TrackedRequest) -> None:
        try:
            await self._deliver_until_acknowledged(tracked)
        finally:
            with contextlib.suppress(VoxError):
                await self.memory.outbox_done(tracked.message_id)

    async def _deliver_until_acknowledged(self, tracked: TrackedRequest) -> None:
        assert self.session is not None
        message = tracked.message
        topic = topics.inbox(message.target, self.id)
        payload = serialize(message)
        deadline = time.monotonic() + self.config.request_timeout
        delay = self.config.resend_initial
        while not tracked.final and not tracked.acknowledged.is_set():
            try:
                await self.session.publish(topic, payload, expiry=self._expiry(message))
                self.tracker.dispatched(message.message_id)
            except DeliveryFailed as exc:
                if exc.reason_code is not None and exc.reason_code >= 0x80:
                    # The broker refused it (ACL): re-sending cannot help.
                    self.tracker.failed(message.message_id, ErrorCode.DELIVERY_FAILED, str(exc))
                    return
                log.info("%s: will re-send %s: %s", self.name, message.message_id, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await tracked.acknowledged.wait()
            if time.monotonic() >= deadline and not tracked.acknowledged.is_set():
                self.tracker.failed(
                    message.message_id,
                    ErrorCode.TIMEOUT,
                    f"no acknowledgement within {self.config.request_timeout:.0f}s",
                )
                return
            delay = min(delay * 2, self.config.resend_max) * random.uniform(0.8, 1.2)

    def _expiry(self, message: VOXMessage) -> int | None:
        deadline = message.details.get("deadline")
        if message.type != MSG_COMMAND_REQUEST or not isinstance(deadline, str):
            return None
        return max(1, int(parse_timestamp(deadline).timestamp() - time.time()))

    async def _publish_ack(self, message: VOXMessage) -> None:
        assert self.session is not None
        ack = message.acknowledgement(message_source=self.config.message_source)
        await self.memory.record_message(ack, "sent")
        try:
            await self.session.publish(topics.inbox(message.source, self.id), serialize(ack))
        except DeliveryFailed as exc:
            # The sender re-sends until acknowledged; its duplicate gets a new ack.
            log.warning("%s: ack for %s not delivered: %s", self.name, message.message_id, exc)

    async def _send_error_to(self, peer: UUID, reply_to: UUID, code: str, reason: str) -> None:
        message = new_message(
            MSG_COMMAND_ERROR,
            source=self.id,
            target=peer,
            reply_to=reply_to,
            details=CommandError(code=code, error=reason[:1000]),
            message_source=self.config.message_source,
        )
        with contextlib.suppress(VoxError):
            await self.send_message(message, expects_reply=False)

    async def _await_reply(self, message: VOXMessage, timeout: float | None) -> VOXMessage:
        tracked = await self.send_message(message, expects_reply=True)
        limit = self.config.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await tracked.done.wait()
        except TimeoutError:
            self.tracker.failed(
                message.message_id, ErrorCode.TIMEOUT, f"no answer within {limit:.1f}s"
            )
        if tracked.state is RequestState.COMPLETED and tracked.reply is not None:
            return tracked.reply
        raise CommandFailed(tracked.error_code or ErrorCode.TIMEOUT, tracked.error or "failed")

    # --- the API roles and consoles use ---------------------------------------------------

    async def request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage:
        """Send a command_request to a child and return its command_result (CommandFailed)."""
        message = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=to,
            details=CommandRequest(command=command, params=params or {}),
            message_source=self.config.message_source,
        )
        return await self._await_reply(message, timeout)

    async def ask(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage:
        """Send a message that expects an answer linked by reply_to, and return the answer."""
        message = new_message(
            type,
            source=self.id,
            target=to,
            details=details,
            message_source=self.config.message_source,
        )
        return await self._await_reply(message, timeout)

    async def send(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        reply_to: UUID | None = None,
        message_source: str | None = None,
    ) -> TrackedRequest:
        """Send an event or answer to the master or a child; it is re-sent until acknowledged."""
        message = new_message(
            type,
            source=self.id,
            target=to,
            details=details,
            reply_to=reply_to,
            message_source=message_source or self.config.message_source,
        )
        return await self.send_message(message, expects_reply=False)

    async def notify_master(
        self, type: str, details: dict[str, Any] | BaseModel, *, message_source: str | None = None
    ) -> TrackedRequest:
        """Send an event up to this agent's master."""
        if self.config.master_id is None:
            raise VoxError(f"{self.name} has no master")
        return await self.send(
            type, details, to=self.config.master_id, message_source=message_source
        )

    async def reply(
        self, message: VOXMessage, type: str, details: dict[str, Any] | BaseModel
    ) -> TrackedRequest:
        """Answer a message: to its source, with reply_to set."""
        return await self.send_message(
            message.reply(type, details, message_source=self.config.message_source),
            expects_reply=False,
        )

    # --- restart --------------------------------------------------------------------------

    async def _resume(self) -> None:
        """After a restart, run commands acknowledged but never started; report interrupted ones."""
        assert self.session is not None
        await self.session.wait_connected(None)
        for _, _, payload in self._unsent:
            try:
                message = parse(payload)
            except InvalidMessage:
                continue
            # Nobody awaits these any more; they only need to reach the peer.
            tracked = self.tracker.track(message, expects_reply=False)
            self._spawn(self._deliver(tracked), "redeliver")
        for row in self._interrupted:
            await self._send_error_to(
                UUID(row["source"]),
                UUID(row["message_id"]),
                ErrorCode.HANDLER_ERROR,
                "the agent restarted while running this command; it is not run twice",
            )
        for row in self._pending:
            request = _request_from_row(row)
            if request is not None and request.source in self.config.peers:
                self._running_handlers += 1
                self._idle.clear()
                self._spawn(self._serve_command(request), "resumed-command")


def _request_from_row(row: Mapping[str, Any]) -> VOXMessage | None:
    """Rebuild an acknowledged command_request from its ledger row."""
    details = row.get("details") or {}
    try:
        return VOXMessage(
            message_id=UUID(row["message_id"]),
            message_source=details.get("message_source") or "vox-mqtt",
            emitted_at=row["emitted_at"],
            source=UUID(row["source"]),
            target=UUID(row["target"]),
            type=MSG_COMMAND_REQUEST,
            details={"command": details["command"], "params": details.get("params") or {}},
            reply_to=UUID(row["reply_to"]) if row.get("reply_to") else None,
        )
    except (KeyError, TypeError, ValueError):
        log.warning("cannot resume command from ledger row %r", row)
        return None
