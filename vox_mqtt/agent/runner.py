"""The command runner: answer each command as its plan's executor says; drain on stop; resume.

Every command it serves is a `Served` record of the request owner (agent/requests.py); the
runner holds only what executing needs: the handler slots, `stopping`, and the executors of
a command's plans (agent/commandsteps.py), which `serve` asks for the command's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from uuid import UUID

from vox_mqtt.agent.commandsteps import (
    CommandStep,
    DelegateStep,
    Redecide,
    ServeStep,
    answered_at_once,
)
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.handlers import call_handler
from vox_mqtt.agent.outbox import Outbox, Outgoing
from vox_mqtt.agent.plan import CommandPlan, Delegate, Serve
from vox_mqtt.agent.ports import Recorder, Settings
from vox_mqtt.agent.prepared import NotStarted, Staged
from vox_mqtt.agent.requests import CURRENT_REQUEST, Requests, Served, ended_by
from vox_mqtt.agent.restart import downstream_from_row, request_from_row
from vox_mqtt.agent.roles import Handler
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import choose_child, down_levels, inactive_reason
from vox_mqtt.agent.sendrules import time_left
from vox_mqtt.ledger.actions import LedgerAction, row_of
from vox_mqtt.observe.metrics import AgentMetrics
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
)
from vox_mqtt.protocol.requeststates import RequestState
from vox_mqtt.protocol.settings import AgentConfig

__all__ = ["CommandRunner", "Planner"]

log = logging.getLogger("vox_mqtt.agent")
# Decides a recorded command again, with the children that refused it unrecorded.
Planner = Callable[[VOXMessage, frozenset[UUID]], CommandPlan]


class CommandRunner:
    """Answer every command_request: run it locally or delegate it to a healthy child."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: Recorder,
        metrics: AgentMetrics,
        tasks: TaskSet,
        outbox: Outbox,
        router: Router,
        fleet_view: FleetView,
        requests: Requests,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._metrics = metrics
        self._tasks = tasks
        self.outbox = outbox
        self.router = router
        self.fleet_view = fleet_view
        self.requests = requests
        self.stopping = False  # new commands are answered SHUTTING_DOWN
        self._handler_slots = asyncio.Semaphore(settings().max_concurrency)
        self.planner: Planner | None = None  # the pipeline's (InboundPipeline.plan_command)
        # The executor of each of a command's plans (agent/commandsteps.py); the pipeline's
        # executor table holds them too.
        self.steps: dict[type, CommandStep[Any]] = {
            Serve: ServeStep(self),
            Delegate: DelegateStep(self),
            **answered_at_once(self),
        }
        metrics.gauge("inflight_commands", lambda: self.requests.in_flight)

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self._settings()

    @property
    def in_flight(self) -> int:
        """Return how many commands this agent is answering right now."""
        return self.requests.in_flight

    @property
    def slot_free(self) -> bool:
        """Tell whether a handler slot can be taken at once."""
        return not self.stopping and not self._handler_slots.locked()

    @property
    def load(self) -> Mapping[UUID, int]:
        """Return the requests in flight per child (read-only)."""
        return self.requests.load

    def children(self) -> list[AgentLiveness | None]:
        """Return this agent's children as the fleet view has them now."""
        return [self.fleet_view.get(c) for c in self.config.children]

    def choose_child(self, command: str) -> tuple[UUID | None, ErrorCode | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        return choose_child(command, self.children(), load=self.requests.load)

    # --- the executors' shared steps ---------------------------------------------------------

    def decided(
        self, request: VOXMessage, refused_by: frozenset[UUID] = frozenset()
    ) -> CommandPlan:
        """Decide a recorded command again with what is true now (plan.decide_command)."""
        assert self.planner is not None, "the pipeline gives the runner its planner"
        return self.planner(request, refused_by)

    async def take_slot(self, served: Served) -> None:
        """Take a handler slot for a command (at once when the plan found one free)."""
        await self._handler_slots.acquire()
        self.requests.took_slot(served)

    async def record_start(self, served: Served) -> None:
        """Record that a command's handler starts now (it waited for a slot)."""
        await self._ledger.record_message(served.request, LedgerAction.STARTED)
        self.requests.move(served, RequestState.WORKING)

    def prepared_answer(
        self, served: Served, details: CommandResult | CommandError
    ) -> Outgoing | None:
        """Check a command's answer for the outbox; None when it cannot be sent as it is."""
        kind = MSG_COMMAND_RESULT if isinstance(details, CommandResult) else MSG_COMMAND_ERROR
        try:
            outgoing = self.outbox.prepare(
                served.request.reply(kind, details), answering=served.request
            )
        except VoxError:
            return None
        code = details.code if isinstance(details, CommandError) else None
        self.requests.answer_prepared(served, outgoing, ended_by(details), code)
        return outgoing

    def ended_at_once(self, end: LedgerAction, code: str | None) -> None:
        """Count a command answered in the commit that recorded it (commandsteps.AnsweredAtOnce)."""
        if code is not None:
            self._metrics.commands_failed.inc(code)
        self._metrics.requests_ended.inc(str(end))

    def forget(self, staged: Staged) -> None:
        """Undo a staged command whose commit failed: nothing of it was recorded or sent."""
        if (served := staged.served) is not None:
            if served.early is not None:
                served.early.cancel()  # idempotent: the sender re-sends, and it runs again then
            self._release(served)
            self.requests.drop(served)

    def begin(self, staged: Staged) -> None:
        """Carry out a staged command whose commit is durable: answer it, in a task of its own."""
        served = staged.served
        if served is None:
            return
        self.requests.committed(served)
        if staged.implied and staged.outgoing is not None:
            # Answered and recorded with its "received" row: only the publish is left, and
            # it needs no task of its own.
            self._release(served)
            self._finish(served, staged.outgoing)
            return
        self.requests.serving(
            served, self._tasks.spawn(self.serve(served, staged.outgoing), "command")
        )

    def _release(self, served: Served) -> None:
        if served.slot:
            self.requests.took_slot(served, False)
            self._handler_slots.release()

    # --- stopping -------------------------------------------------------------------------

    async def drain(self, grace: float) -> None:
        """Refuse new commands; let running ones finish within grace, then answer the rest."""
        self.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.requests.wait_idle()
        if self.requests.in_flight:
            await self._answer_unfinished_shutting_down()

    async def _answer_unfinished_shutting_down(self) -> None:
        """Answer every command still running after the grace period, then let it be cut."""
        answers = []
        for served in self.requests.unanswered():
            if not self.requests.claim_answer(served):
                continue
            request = served.request
            name = str(request.details.get("command", ""))
            error = CommandError(
                code=ErrorCode.SHUTTING_DOWN,
                error=f"{self.config.name} is stopping and {name!r} did not finish in time",
                command=name or None,
            )
            self._metrics.commands_failed.inc(ErrorCode.SHUTTING_DOWN)
            with contextlib.suppress(VoxError):
                answers.append(
                    await self.outbox.send_message(
                        request.reply(MSG_COMMAND_ERROR, error),
                        expects_reply=False,
                        then=[(request, LedgerAction.FAILED, None)],
                        answering=request,
                    )
                )
            self.requests.move(served, RequestState.FAILED)
        # A moment for the answers to reach the broker; one that does not is held for replay
        # and goes out when its requester re-sends the request (docs/messages.md).
        if answers:
            await self.outbox.acks.flush(2.0)

    # --- serving --------------------------------------------------------------------------

    async def serve(self, served: Served, committed: Outgoing | None) -> None:
        """Answer a command whose record committed, as its plan's executor carries it out."""
        if served.final:
            return  # canceled before its task ran (agent/lifecycle.py): it never starts
        CURRENT_REQUEST.set(served)  # this task's own context: the handler's progress()
        if served.slot:
            self.requests.move(served, RequestState.WORKING)  # its "started" row committed
        try:
            details = await self._answer(served, committed)
        except Exception as exc:  # the last line of defence: answer, never crash
            log.exception("%s: command failed", self.config.name)
            details = CommandError(code=ErrorCode.HANDLER_ERROR, error=f"{type(exc).__name__}")
        finally:
            self._release(served)
        durable = served.answer_durable
        if durable is not None and await durable and served.answer is not None:
            # Recorded with the child's answer: publish it, whatever the wait said since.
            self._finish(served, served.answer)
            return
        if not self.requests.claim_answer(served):
            return  # already answered SHUTTING_DOWN when the grace period ran out
        end = _end_of(details)
        try:
            # The end its row recorded: the record says what the ledger says (a result too
            # large to send ends `failed`, a CANCELED error `canceled`).
            end = await self._send_answer(served, details, end)
        finally:
            self.requests.move(served, end)

    async def _answer(
        self, served: Served, committed: Outgoing | None
    ) -> CommandResult | CommandError:
        """The command's answer, as its plan's executor finds it; decided again on a new fact."""
        refused: set[UUID] = set()
        while True:
            step = self.steps[type(served.plan)]
            outcome = await step.answer(served, served.plan, committed)
            if not isinstance(outcome, Redecide):
                return outcome
            committed = None  # what the first plan committed is spent
            if outcome.refused_by is not None:
                refused.add(outcome.refused_by)
                if outcome.refusal is not None:
                    self.requests.refused_by_child(served, outcome.refusal)
            self.requests.replan(served, self.decided(served.request, frozenset(refused)))

    def _finish(self, served: Served, answer: Outgoing) -> None:
        """Publish an answer whose "sent" row committed already, and close the command."""
        if served.answer_code is not None:
            self._metrics.commands_failed.inc(served.answer_code)
        assert served.answer_end is not None, "prepared with its answer (answer_prepared)"
        self.requests.move(served, served.answer_end)
        self.outbox.dispatch(answer)

    async def _send_answer(
        self, served: Served, details: CommandResult | CommandError, end: RequestState
    ) -> RequestState:
        """Send a command's answer with its end row; return the end recorded (or meant)."""
        request = served.request
        if isinstance(details, CommandResult):
            kind = MSG_COMMAND_RESULT
        else:
            kind = MSG_COMMAND_ERROR
            self._metrics.commands_failed.inc(details.code)
        with contextlib.suppress(VoxError):
            # The reply's "sent" row (with the reply in the outbox) is what marks the
            # command finished: from then on a restart re-sends the answer, never re-runs.
            # The "completed" or "failed" row commits in the same transaction.
            try:
                await self.outbox.send_message(
                    request.reply(kind, details),
                    expects_reply=False,
                    then=[(request, row_of(end), served.outcome_of(end))],
                    answering=request,
                )
            except MessageTooLarge as exc:
                name = str(request.details.get("command", ""))
                log.warning("%s: %s: %s", self.config.name, name, exc)
                too_large = CommandError(
                    code=ErrorCode.MESSAGE_TOO_LARGE,
                    error=f"the result of {name!r} is too large to send: {exc}",
                    command=name or None,
                )
                end = RequestState.FAILED
                await self.outbox.send_message(
                    request.reply(MSG_COMMAND_ERROR, too_large),
                    expects_reply=False,
                    then=[(request, row_of(end), None)],
                    answering=request,
                )
            except LedgerError:
                # It cannot be recorded (the disk is full): answer anyway, once.
                await self.outbox.publish_unrecorded(request.reply(kind, details))
        return end

    async def run(
        self, handler: Handler, name: str, payload: CommandRequest, timeout: float
    ) -> CommandResult | CommandError:
        metrics = self._metrics
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

    def timeout_of(self, payload: CommandRequest) -> float:
        # The caller's deadline, however far; request_timeout only for a request without one.
        return time_left(payload.deadline, self.config.request_timeout)

    def unroutable(self, name: str, code: ErrorCode) -> CommandError:
        """Answer a command neither a role here nor a healthy child serves."""
        if code == ErrorCode.TARGET_INACTIVE:
            # Offline, not unknown (REQ-001-US-002-008): say at which level they are down.
            levels = down_levels(name, self.children())
            reason = inactive_reason(name, self.config.name, levels)
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

    def downstream(self, request: VOXMessage, child: UUID) -> VOXMessage:
        """The command_request that sends a command on to a child, as this agent."""
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

    async def delegation_outcome(
        self, served: Served, timeout: float, *, started: float
    ) -> CommandResult | CommandError:
        """Wait for the downstream request's reply and answer for it as this agent."""
        tracked = served.downstream
        assert tracked is not None
        name = str(served.request.details.get("command", ""))
        self._metrics.commands_delegated.inc(name)
        try:
            reply = await self.outbox.reply_to(tracked, timeout, started=started)
        except CommandFailed as exc:
            return CommandError(code=exc.code, error=exc.error, command=name)
        finally:
            self.requests.undelegate(served)
        result = reply.payload_as(CommandResult)
        # The master answers for the work: upstream never learns the child exists.
        return CommandResult(
            command=name, result=result.result, summary=result.summary, handled_by=self.config.id
        )

    # --- restart --------------------------------------------------------------------------

    def adopt(self, delegated: Iterable[Mapping[str, Any]]) -> set[str]:
        """After a restart, before connecting: wait again for the answers children owe.

        Each command delegated before the restart (and not answered) becomes a `Served`
        record again, DELEGATED to its child with the downstream request tracked, so the
        child's answer, whenever it comes, is relayed up as if nothing had happened; its
        deadline still bounds the wait. Returns the ids adopted; any other interrupted
        command is reported as before (resume).
        """
        adopted: set[str] = set()
        for row in delegated:
            request = request_from_row(row)
            down = row.get("downstream")
            if request is None or down is None or request.source not in self.config.peers:
                continue
            child, downstream = downstream_from_row(down, request, me=self.config.id)
            if child not in self.config.children:
                continue  # no longer a child (the fleet changed): reported interrupted
            tracked = self.requests.sent.track(downstream, expects_reply=True)
            served = self.requests.open(request, Delegate(child=child), recorded=True)
            self.requests.delegate(served, child, tracked)
            if row.get("canceling"):
                self.requests.passing_cancel_down(served)  # its cancel passed down already
            self.requests.serving(served, self._tasks.spawn(self.serve(served, None), "adopted"))
            adopted.add(str(request.message_id))
        return adopted

    async def _report_interrupted(self, row: Mapping[str, Any]) -> None:
        """Answer a command a restart cut HANDLER_ERROR, held for replay like any answer."""
        why = "the agent restarted while running this command; it is not run twice"
        request = request_from_row(row)
        if request is None:  # a row that does not read back: answered once, unheld
            code, source, request_id = ErrorCode.HANDLER_ERROR, row["source"], row["message_id"]
            await self.outbox.send_error_to(UUID(source), UUID(request_id), code, why)
            return
        error = CommandError(code=ErrorCode.HANDLER_ERROR, error=why)
        answer = request.reply(MSG_COMMAND_ERROR, error, message_source=self.config.message_source)
        with contextlib.suppress(VoxError):
            await self.outbox.send_message(answer, expects_reply=False, answering=request)

    async def resume(
        self, interrupted: Iterable[Mapping[str, Any]], pending: Iterable[Mapping[str, Any]]
    ) -> None:
        """After a restart: report interrupted commands, run acknowledged but unstarted ones.

        Each pending one is decided again (`decided`): its `received` row committed long
        ago, so nothing starts at once: it takes a slot and records `started` as any
        command that waited for one.
        """
        for row in interrupted:
            self._metrics.commands_failed.inc(ErrorCode.HANDLER_ERROR)
            await self._report_interrupted(row)
        for row in pending:
            request = request_from_row(row)
            if request is not None and request.source in self.config.peers:
                served = self.requests.open(request, self.decided(request), recorded=True)
                task = self._tasks.spawn(self.serve(served, None), "resumed")
                self.requests.serving(served, task)


def _end_of(details: CommandResult | CommandError) -> RequestState:
    """The end a handler's answer gives its command: `expired` for one that never started."""
    return RequestState.EXPIRED if isinstance(details, NotStarted) else ended_by(details)
