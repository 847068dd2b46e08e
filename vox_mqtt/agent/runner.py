"""The command runner: serve commands here or delegate them down; drain on stop; resume."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any
from uuid import UUID

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.handlers import call_handler
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import Plan, Step
from vox_mqtt.agent.prepared import Answer, Delegation, NotStarted, QuickAnswer, refused_unrecorded
from vox_mqtt.agent.restart import request_from_row
from vox_mqtt.agent.roles import Handler
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import choose_child
from vox_mqtt.agent.tracking import TrackedRequest
from vox_mqtt.observe.status import AgentLiveness, FleetView
from vox_mqtt.protocol.errors import CommandFailed, LedgerError, MessageTooLarge, VoxError
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandError,
    CommandRequest,
    CommandResult,
    ErrorCode,
    VOXMessage,
    new_message,
    parse_timestamp,
)
from vox_mqtt.protocol.settings import AgentConfig

__all__ = ["CommandRunner"]

log = logging.getLogger("vox_mqtt.agent")


class CommandRunner:
    """Answer every command_request: run it locally or delegate it to a healthy child."""

    def __init__(
        self, ctx: AgentContext, *, outbox: Outbox, router: Router, fleet_view: FleetView
    ) -> None:
        self.ctx = ctx
        self.outbox = outbox
        self.router = router
        self.fleet_view = fleet_view
        self.stopping = False  # new commands are answered SHUTTING_DOWN
        self._handler_slots = asyncio.Semaphore(ctx.config.max_concurrency)
        self._delegated: dict[UUID, int] = {}  # child id -> requests in flight
        self._running = 0
        self._serving: dict[UUID, VOXMessage] = {}  # command requests being answered
        # Commands whose "started" row committed with their "received" one, a handler slot
        # already taken for each (see take_slot).
        self._started_at_once: set[UUID] = set()
        # Commands whose "delegated" row and downstream request committed with their
        # "received" row (see prepare_delegation), by request id.
        self._delegated_at_once: dict[UUID, Delegation] = {}
        # Downstream request id -> (the command it serves, its name), while its answer is due.
        self._awaiting_child: dict[UUID, tuple[VOXMessage, str]] = {}
        # Commands whose answer committed with the child's answer (see prepare_relayed_answer).
        self._answered_at_once: dict[UUID, Answer] = {}
        # Idempotent commands whose handler started before their record committed (see
        # run_early), and those whose quick answer committed with it (quick_answer).
        self._running_at_once: dict[UUID, asyncio.Task[CommandResult | CommandError]] = {}
        self._quick_answers: dict[UUID, QuickAnswer] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        ctx.metrics.gauge("inflight_commands", lambda: self._running)

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self.ctx.config

    @property
    def in_flight(self) -> int:
        """Return how many commands this agent is answering right now."""
        return self._running

    def begin(self, request: VOXMessage, plan: Plan, handler: Handler | None = None) -> None:
        """Start answering a recorded command_request as its plan says (docs/architecture.md).

        handler: the role's, for a SERVE plan (the router was consulted for the plan).
        """
        self._running += 1
        self._idle.clear()
        self.ctx.tasks.spawn(self._serve(request, plan, handler), "command")

    @property
    def slot_free(self) -> bool:
        """Tell whether a handler slot can be taken at once."""
        return not self.stopping and not self._handler_slots.locked()

    @property
    def load(self) -> Mapping[UUID, int]:
        """Return the requests in flight per child (read-only)."""
        return MappingProxyType(self._delegated)

    def children(self) -> list[AgentLiveness | None]:
        """Return this agent's children as the fleet view has them now."""
        return [self.fleet_view.get(c) for c in self.config.children]

    def awaits_child(self, downstream: UUID) -> bool:
        """Tell whether a request sent down from here is awaited to answer a command upstream."""
        waiting = self._awaiting_child.get(downstream)
        tracked = self.ctx.tracker.get(downstream)
        return waiting is not None and tracked is not None and not tracked.final

    async def take_slot(self, request: VOXMessage) -> None:
        """Take a handler slot for a command whose plan starts it now (Plan.start_now).

        Its "started" row then commits with its "received" row (docs/ledger.md); if that
        commit fails, call cancel_start.
        """
        await self._handler_slots.acquire()  # free, as the plan found: returns at once
        self._started_at_once.add(request.message_id)

    def cancel_start(self, request: VOXMessage) -> None:
        """Give back the slot take_slot took: the commit with the started row failed."""
        if request.message_id in self._started_at_once:
            self._started_at_once.discard(request.message_id)
            self._handler_slots.release()
        running = self._running_at_once.pop(request.message_id, None)
        if running is not None:
            running.cancel()  # idempotent: the sender re-sends, and it runs again then
        quick = self._quick_answers.pop(request.message_id, None)
        if quick is not None:
            self.outbox.forget(quick.outgoing)

    def run_early(
        self, request: VOXMessage, handler: Handler
    ) -> asyncio.Task[CommandResult | CommandError]:
        """Start an idempotent command's handler now, before its record commits (Plan.run_early).

        Only after take_slot; a command not declared idempotent never gets here, as its start
        must be durable before its handler runs.
        """
        payload = request.payload_as(CommandRequest)
        running = asyncio.ensure_future(
            self._run(handler, payload.command, payload, self._timeout_of(payload))
        )
        self._running_at_once[request.message_id] = running
        return running

    def quick_answer(
        self, request: VOXMessage, details: CommandResult | CommandError
    ) -> QuickAnswer | None:
        """Prepare the answer of an idempotent command that finished within the window.

        Its "sent" row (whole in the outbox) and the command's end row then commit with the
        request's "received" and "started" rows; the answer stands for the acknowledgement.
        None: it takes the ordinary path (too large to send, say, which that path answers).
        """
        kind = MSG_COMMAND_RESULT if isinstance(details, CommandResult) else MSG_COMMAND_ERROR
        try:
            outgoing = self.outbox.prepare(request.reply(kind, details), expects_reply=False)
        except VoxError:
            return None
        quick = QuickAnswer(
            outgoing=outgoing,
            end="completed" if kind == MSG_COMMAND_RESULT else "failed",
            code=details.code if isinstance(details, CommandError) else None,
        )
        self._quick_answers[request.message_id] = quick
        return quick

    def prepare_delegation(self, request: VOXMessage, child: UUID) -> Delegation | None:
        """Prepare the downstream request of a command its plan delegates to a child.

        The downstream request, its outbox entry and the "delegated" row then commit with the
        request's "received" row (docs/ledger.md); if that commit fails, call
        cancel_delegation. None: it cannot be prepared (too large), and serving it takes
        the ordinary path, which says why.
        """
        payload = request.payload_as(CommandRequest)
        downstream = self._downstream(request, child)
        try:
            outgoing = self.outbox.prepare(downstream, expects_reply=True)
        except VoxError:
            return None
        self._load(child, +1)
        delegation = Delegation(child=child, payload=payload, outgoing=outgoing)
        self._delegated_at_once[request.message_id] = delegation
        return delegation

    def cancel_delegation(self, request: VOXMessage) -> None:
        """Undo prepare_delegation: the commit with its rows failed, nothing was sent."""
        delegation = self._delegated_at_once.pop(request.message_id, None)
        if delegation is not None:
            self._load(delegation.child, -1)
            self.outbox.forget(delegation.outgoing)

    def prepare_relayed_answer(self, reply: VOXMessage) -> Answer | None:
        """Prepare the answer upstream to a child's answer (Step.RELAY_ANSWER).

        Its "sent" row (whole in the outbox) and the command's "completed" or "failed" row
        then commit with the child answer's "received" row (docs/ledger.md); call
        answer_recorded with the outcome of that commit. None: the command is no longer
        waiting for it here, or the answer cannot be prepared; the ordinary path answers.
        """
        assert reply.reply_to is not None
        waiting = self._awaiting_child.get(reply.reply_to)
        if waiting is None:
            return None
        request, name = waiting
        if request.message_id not in self._serving or request.message_id in self._answered_at_once:
            return None
        details: CommandResult | CommandError
        try:
            if reply.type == MSG_COMMAND_RESULT:
                result = reply.payload_as(CommandResult)
                details = CommandResult(
                    command=name,
                    result=result.result,
                    summary=result.summary,
                    handled_by=self.config.id,
                )
            else:
                error = reply.payload_as(CommandError)
                details = CommandError(code=error.code, error=error.error, command=name)
            kind = MSG_COMMAND_RESULT if isinstance(details, CommandResult) else MSG_COMMAND_ERROR
            outgoing = self.outbox.prepare(request.reply(kind, details), expects_reply=False)
        except (ValueError, VoxError):
            return None  # the ordinary path answers it (too large, malformed)
        end = "completed" if kind == MSG_COMMAND_RESULT else "failed"
        # Out of _serving: a stop's SHUTTING_DOWN answer must not race this one.
        del self._serving[request.message_id]
        answer = Answer(
            request=request,
            outgoing=outgoing,
            end=end,
            code=None if isinstance(details, CommandResult) else details.code,
            recorded=asyncio.get_running_loop().create_future(),
        )
        self._answered_at_once[request.message_id] = answer
        return answer

    def answer_recorded(self, answer: Answer, recorded: bool) -> None:
        """Say whether the commit holding a prepare_relayed_answer answer reached the disk."""
        if not recorded:
            self.outbox.forget(answer.outgoing)
            del self._answered_at_once[answer.request.message_id]
            self._serving[answer.request.message_id] = answer.request
        if not answer.recorded.done():
            answer.recorded.set_result(recorded)

    def _load(self, child: UUID, change: int) -> None:
        self._delegated[child] = self._delegated.get(child, 0) + change

    def choose_child(
        self, command: str, *, avoid: Iterable[UUID] = ()
    ) -> tuple[UUID | None, ErrorCode | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        skip = set(avoid)
        entries = (self.fleet_view.get(c) for c in self.config.children if c not in skip)
        return choose_child(command, entries, load=self._delegated)

    # --- stopping -------------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Refuse new commands; let running ones finish within grace, then answer the rest."""
        self.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        if not self._idle.is_set():
            await self._answer_unfinished_shutting_down()

    async def _answer_unfinished_shutting_down(self) -> None:
        """Answer every command still running after the grace period, then let it be cut."""
        answers = []
        for request in list(self._serving.values()):
            self._serving.pop(request.message_id, None)
            name = str(request.details.get("command", ""))
            error = CommandError(
                code=ErrorCode.SHUTTING_DOWN,
                error=f"{self.config.name} is stopping and {name!r} did not finish in time",
                command=name or None,
            )
            self.ctx.metrics.commands_failed.inc(ErrorCode.SHUTTING_DOWN)
            with contextlib.suppress(VoxError):
                answers.append(
                    await self.outbox.send_message(
                        request.reply(MSG_COMMAND_ERROR, error), expects_reply=False
                    )
                )
        # A moment for the answers to be acknowledged; unacknowledged ones stay in the
        # outbox and go out after the next start.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                for tracked in answers:
                    await tracked.acknowledged.wait()

    # --- serving --------------------------------------------------------------------------

    async def _serve(self, request: VOXMessage, plan: Plan, handler: Handler | None) -> None:
        quick = self._quick_answers.pop(request.message_id, None)
        if quick is not None:
            # Answered and recorded with its "received" row: only the publish is left.
            self._running_at_once.pop(request.message_id, None)
            self._started_at_once.discard(request.message_id)
            self._handler_slots.release()
            self._running -= 1
            if self._running == 0:
                self._idle.set()
            if quick.code is not None:
                self.ctx.metrics.commands_failed.inc(quick.code)
            self.outbox.dispatch(quick.outgoing)
            return
        self._serving[request.message_id] = request
        try:
            details = await self._answer(request, plan, handler)
        except Exception as exc:  # the last line of defence: answer, never crash
            log.exception("%s: command failed", self.config.name)
            details = CommandError(code=ErrorCode.HANDLER_ERROR, error=f"{type(exc).__name__}")
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()
        answer = self._answered_at_once.get(request.message_id)
        if answer is not None and await answer.recorded:
            # Recorded with the child's answer: publish it, whatever the wait said since.
            del self._answered_at_once[request.message_id]
            if answer.code is not None:
                self.ctx.metrics.commands_failed.inc(answer.code)
            self.outbox.dispatch(answer.outgoing)
            return
        if self._serving.pop(request.message_id, None) is None:
            return  # already answered SHUTTING_DOWN when the grace period ran out
        if isinstance(details, CommandResult):
            kind = MSG_COMMAND_RESULT
        else:
            kind = MSG_COMMAND_ERROR
            self.ctx.metrics.commands_failed.inc(details.code)
        end = "completed" if kind == MSG_COMMAND_RESULT else "failed"
        if isinstance(details, NotStarted):
            end = "expired"
        with contextlib.suppress(VoxError):
            # The reply's "sent" row (with the reply in the outbox) is what marks the
            # command finished: from then on a restart re-sends the answer, never re-runs.
            # The "completed" or "failed" row commits in the same transaction.
            try:
                await self.outbox.send_message(
                    request.reply(kind, details), expects_reply=False, then=[(request, end, None)]
                )
            except MessageTooLarge as exc:
                kind, name = MSG_COMMAND_ERROR, str(request.details.get("command", ""))
                log.warning("%s: %s: %s", self.config.name, name, exc)
                too_large = CommandError(
                    code=ErrorCode.MESSAGE_TOO_LARGE,
                    error=f"the result of {name!r} is too large to send: {exc}",
                    command=name or None,
                )
                await self.outbox.send_message(
                    request.reply(kind, too_large),
                    expects_reply=False,
                    then=[(request, "failed", None)],
                )
            except LedgerError:
                # It cannot be recorded (the disk is full): answer anyway, once.
                await self.outbox.publish_unrecorded(request.reply(kind, details))
                return

    async def _answer(
        self, request: VOXMessage, plan: Plan, handler: Handler | None
    ) -> CommandResult | CommandError:
        payload = request.payload_as(CommandRequest)
        name = payload.command
        step = plan.step
        if step is Step.EXPIRED:
            # Its master gave up at that deadline: running it now would be work nobody
            # awaits (a re-delivery, a queue that held it, a restart in between).
            return NotStarted(
                code=ErrorCode.TIMEOUT,
                error=f"{name!r} reached {self.config.name} after its deadline: not started",
                command=name,
            )
        if step is Step.UNROUTABLE:
            return self._unroutable(name, plan.code or ErrorCode.NO_ROUTE)
        delegation = self._delegated_at_once.pop(request.message_id, None)
        if delegation is not None:
            # Its downstream request committed with its "received" row: send it now.
            self.outbox.dispatch(delegation.outgoing)
            timeout = self._timeout_of(payload)
            outcome = await self._delegation_outcome(
                request, delegation.child, delegation.outgoing.tracked, timeout
            )
            if refused_unrecorded(outcome):
                return await self._delegate(
                    request, payload, timeout, refused={delegation.child}, outcome=outcome
                )
            return outcome
        running = self._running_at_once.pop(request.message_id, None)
        if running is not None:
            # Idempotent: its handler started while its record committed.
            self._started_at_once.discard(request.message_id)
            try:
                return await running
            finally:
                self._handler_slots.release()
        if request.message_id in self._started_at_once:
            # Its "started" row committed with its "received" one, its slot taken then.
            self._started_at_once.discard(request.message_id)
            assert handler is not None  # a SERVE plan that starts at once names it
            try:
                return await self._run(handler, name, payload, self._timeout_of(payload))
            finally:
                self._handler_slots.release()
        if step is Step.STOPPING or self.stopping:
            return CommandError(
                code=ErrorCode.SHUTTING_DOWN, error="agent is stopping", command=name
            )
        timeout = self._timeout_of(payload)
        if handler is not None:
            async with self._handler_slots:
                await self.ctx.ledger.record_message(request, "started")
                return await self._run(handler, name, payload, timeout)
        return await self._delegate(request, payload, timeout)

    async def _run(
        self, handler: Handler, name: str, payload: CommandRequest, timeout: float
    ) -> CommandResult | CommandError:
        metrics = self.ctx.metrics
        metrics.commands_served.inc(name)
        started = time.perf_counter()
        try:
            return await call_handler(
                handler,
                name,
                payload.params,
                timeout,
                agent=self.config.name,
                handled_by=self.config.id,
            )
        finally:
            metrics.command_handler_seconds.time_since(started)

    def _timeout_of(self, payload: CommandRequest) -> float:
        timeout = self.config.request_timeout
        if payload.deadline is not None:
            remaining = parse_timestamp(payload.deadline).timestamp() - time.time()
            timeout = max(0.0, min(timeout, remaining))
        return timeout

    async def _delegate(
        self,
        request: VOXMessage,
        payload: CommandRequest,
        timeout: float,
        *,
        refused: set[UUID] | None = None,
        outcome: CommandResult | CommandError | None = None,
    ) -> CommandResult | CommandError:
        """Delegate to one child after another while they refuse it unrecorded.

        refused: the children that already did, outcome: the last one's refusal.
        """
        name = payload.command
        refused = set() if refused is None else refused
        while True:
            child, code = self.choose_child(name, avoid=refused)
            if child is None and outcome is not None:
                return outcome  # every child that could have served it refused it unrecorded
            outcome = await self._delegate_to(child, code, request, payload, timeout)
            if not refused_unrecorded(outcome):
                return outcome
            # That child cannot record and did nothing: the work goes to another, if any.
            assert child is not None
            refused.add(child)

    async def _delegate_to(
        self,
        child: UUID | None,
        code: ErrorCode | None,
        request: VOXMessage,
        payload: CommandRequest,
        timeout: float,
    ) -> CommandResult | CommandError:
        name = payload.command
        if child is None:
            return self._unroutable(name, code or ErrorCode.NO_ROUTE)
        downstream = self._downstream(request, child)
        started = time.perf_counter()
        self._load(child, +1)
        try:
            # The "delegated" row commits with the downstream request's "sent" row.
            then = [(request, "delegated", str(child))]
            tracked = await self.outbox.send_message(downstream, expects_reply=True, then=then)
        except BaseException:
            self._load(child, -1)
            raise
        return await self._delegation_outcome(request, child, tracked, timeout, started=started)

    def _unroutable(self, name: str, code: ErrorCode) -> CommandError:
        """Answer a command neither a role here nor a healthy child serves."""
        if code == ErrorCode.TARGET_INACTIVE:
            reason = f"no child that serves {name!r} is healthy"
        else:
            # Say what does exist: a typo is then one look away from its fix.
            serves = sorted(
                self.router.commands | self.fleet_view.commands_of(self.config.children)
            )
            reason = (
                f"{self.config.name} cannot route {name!r}: neither it nor a child serves "
                f"it; it serves: {', '.join(serves) or 'nothing'}"
            )
        return CommandError(code=code, error=reason, command=name)

    def _downstream(self, request: VOXMessage, child: UUID) -> VOXMessage:
        return new_message(
            MSG_COMMAND_REQUEST,
            source=self.config.id,
            target=child,
            # What arrived, unchanged, from its origin (seed 003): the details as received,
            # not a view of them, and the message_source the request came with.
            details=request.details,
            reply_to=request.message_id,
            message_source=request.message_source,
        )

    async def _delegation_outcome(
        self,
        request: VOXMessage,
        child: UUID,
        tracked: TrackedRequest,
        timeout: float,
        *,
        started: float | None = None,
    ) -> CommandResult | CommandError:
        """Wait for a sent downstream request's reply and answer for it as this agent."""
        name = str(request.details.get("command", ""))
        self.ctx.metrics.commands_delegated.inc(name)
        self._awaiting_child[tracked.message_id] = (request, name)
        try:
            reply = await self.outbox.reply_to(
                tracked, timeout, started=time.perf_counter() if started is None else started
            )
        except CommandFailed as exc:
            return CommandError(code=exc.code, error=exc.error, command=name)
        finally:
            del self._awaiting_child[tracked.message_id]
            self._load(child, -1)
        result = reply.payload_as(CommandResult)
        # The master answers for the work: upstream never learns the child exists.
        return CommandResult(
            command=name, result=result.result, summary=result.summary, handled_by=self.config.id
        )

    # --- restart --------------------------------------------------------------------------

    async def resume(
        self,
        interrupted: Iterable[Mapping[str, Any]],
        pending: Iterable[Mapping[str, Any]],
        plan: Callable[[VOXMessage], tuple[Plan, Handler | None]],
    ) -> None:
        """After a restart: report interrupted commands, run acknowledged but unstarted ones.

        plan: what the pipeline decides for a command read back from the ledger (its
        `received` row committed long ago, so nothing starts at once: it takes a slot and
        records `started` as any command that waited for one).
        """
        for row in interrupted:
            self.ctx.metrics.commands_failed.inc(ErrorCode.HANDLER_ERROR)
            await self.outbox.send_error_to(
                UUID(row["source"]),
                UUID(row["message_id"]),
                ErrorCode.HANDLER_ERROR,
                "the agent restarted while running this command; it is not run twice",
            )
        for row in pending:
            request = request_from_row(row)
            if request is not None and request.source in self.config.peers:
                self.begin(request, *plan(request))
