"""The command runner: serve commands here or delegate them down; drain on stop; resume.

Every command it serves is a `Served` record of the request owner (agent/requests.py); the
runner holds only what executing needs: the handler slots and `stopping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from uuid import UUID

from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.handlers import call_handler
from vox_mqtt.agent.outbox import Outbox, Outgoing
from vox_mqtt.agent.plan import Plan, Step
from vox_mqtt.agent.ports import Recorder, Settings
from vox_mqtt.agent.prepared import NotStarted, Staged, refused_unrecorded, relayed_details
from vox_mqtt.agent.requests import CURRENT_REQUEST, Requests, Served, ServedState, ended_by
from vox_mqtt.agent.restart import downstream_from_row, request_from_row
from vox_mqtt.agent.roles import Handler
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import choose_child, down_levels, inactive_reason
from vox_mqtt.agent.sendrules import time_left
from vox_mqtt.ledger.actions import LedgerAction
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
from vox_mqtt.protocol.settings import AgentConfig

__all__ = ["QUICK_ANSWER_WINDOW", "CommandRunner"]

log = logging.getLogger("vox_mqtt.agent")
# How long an idempotent command may take for its answer to commit with its record and stand
# for its acknowledgement (docs/messages.md, acknowledgements). A slower one is acknowledged
# as usual once its record commits; the wait delays nothing else.
QUICK_ANSWER_WINDOW = 0.005


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

    def choose_child(
        self, command: str, *, avoid: Iterable[UUID] = ()
    ) -> tuple[UUID | None, ErrorCode | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        skip = set(avoid)
        entries = (self.fleet_view.get(c) for c in self.config.children if c not in skip)
        return choose_child(command, entries, load=self.requests.load)

    # --- one commit: stage, then execute or drop --------------------------------------------

    async def stage(self, message: VOXMessage, plan: Plan, handler: Handler | None) -> Staged:
        """Stage what a plan adds to an inbound message's commit (docs/ledger.md).

        Once that commit is durable, execute() the staged plan; if it fails, drop() it.
        """
        if message.type == MSG_COMMAND_REQUEST:
            served = self.requests.open(message, plan, handler)
            staged = Staged(served=served)
            if plan.step is Step.SERVE and plan.start_now:
                await self._stage_start(staged)
            elif plan.step is Step.DELEGATE:
                self._stage_delegation(staged)
            return staged
        if plan.step is Step.RELAY_ANSWER:
            return self._stage_relayed_answer(message)
        return Staged()

    async def _stage_start(self, staged: Staged) -> None:
        # The slot is free, as the plan found: taking it returns at once, and the command's
        # "started" row commits with its "received" one.
        served = staged.served
        assert served is not None
        await self._handler_slots.acquire()
        served.slot = True
        staged.rows.append((served.request, LedgerAction.STARTED, None))
        if not served.plan.run_early:
            return
        assert served.handler is not None  # a SERVE plan names its handler
        # Idempotent: its handler runs while its record commits; answered within the window,
        # one commit holds its record, start, answer (whole in the outbox) and end, and the
        # answer, sent once that is durable, is its acknowledgement (docs/messages.md).
        payload = served.request.payload_as(CommandRequest)
        context = contextvars.copy_context()  # the handler's progress() finds its command
        context.run(CURRENT_REQUEST.set, served)
        running = asyncio.get_running_loop().create_task(
            self._run(served.handler, payload.command, payload, self._timeout_of(payload)),
            context=context,
        )
        served.early = running
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(running), QUICK_ANSWER_WINDOW)
        if not running.done() or running.cancelled() or running.exception() is not None:
            return  # slower: its record commits now, and its answer later, as usual
        outgoing = self._prepared_answer(served, running.result())
        if outgoing is not None:
            staged.outgoing, staged.implied = outgoing, True
            staged.rows.append((outgoing.message, LedgerAction.SENT, None))
            staged.rows.append((served.request, LedgerAction(served.answer_end), None))

    def _stage_delegation(self, staged: Staged) -> None:
        # Its downstream request and "delegated" row commit with its "received" row: one
        # commit on the way down instead of two (docs/ledger.md).
        served = staged.served
        assert served is not None
        assert served.plan.child is not None
        child = served.plan.child
        try:
            outgoing = self.outbox.prepare(
                self._downstream(served.request, child), expects_reply=True
            )
        except VoxError:
            return  # too large to send: the ordinary path says why
        staged.outgoing = outgoing
        staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        staged.rows.append((served.request, LedgerAction.DELEGATED, str(child)))

    def _stage_relayed_answer(self, reply: VOXMessage) -> Staged:
        # A child's answer: this agent's answer upstream commits with it, one commit on the
        # way up instead of two (docs/ledger.md).
        assert reply.reply_to is not None
        served = self.requests.relaying(reply.reply_to)
        if served is None or not self.requests.claim_answer(served):
            return Staged()  # no longer awaited here: the ordinary path answers
        name = str(served.request.details.get("command", ""))
        details = relayed_details(reply, name, handled_by=self.config.id)
        outgoing = None if details is None else self._prepared_answer(served, details)
        if outgoing is None:
            served.answering = False  # the ordinary path answers it (too large, malformed)
            return Staged()
        served.answer_durable = asyncio.get_running_loop().create_future()
        staged = Staged(relayed=served, outgoing=outgoing)
        staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        end = served.answer_end
        staged.rows.append((served.request, LedgerAction(end), served.outcome_of(end)))
        return staged

    def _prepared_answer(
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
        served.answer = outgoing
        served.answer_end = str(ended_by(details))
        served.answer_code = details.code if isinstance(details, CommandError) else None
        return outgoing

    def drop(self, staged: Staged) -> None:
        """Undo a staged plan whose commit failed: nothing of it was recorded or sent."""
        if (served := staged.served) is not None:
            if served.early is not None:
                served.early.cancel()  # idempotent: the sender re-sends, and it runs again then
            self._release(served)
            self.requests.drop(served)
        if (relayed := staged.relayed) is not None:
            relayed.answer = None
            relayed.answering = False
            if relayed.answer_durable is not None and not relayed.answer_durable.done():
                relayed.answer_durable.set_result(False)

    def execute(self, staged: Staged) -> None:
        """Carry out a staged plan whose commit is durable."""
        if (relayed := staged.relayed) is not None:
            assert relayed.answer_durable is not None
            if not relayed.answer_durable.done():
                relayed.answer_durable.set_result(True)
        served = staged.served
        if served is None:
            return
        if staged.implied and staged.outgoing is not None:
            # Answered and recorded with its "received" row: only the publish is left, and
            # it needs no task of its own.
            self._release(served)
            self._finish(served, staged.outgoing)
            return
        served.task = self._tasks.spawn(self._serve(served, staged.outgoing), "command")

    def begin(self, request: VOXMessage, plan: Plan, handler: Handler | None = None) -> None:
        """Start answering a command_request recorded earlier (a restart) as its plan says."""
        self.execute(Staged(served=self.requests.open(request, plan, handler)))

    def _release(self, served: Served) -> None:
        if served.slot:
            served.slot = False
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
            self.requests.move(served, ServedState.FAILED)
        # A moment for the answers to reach the broker; one that does not is held for replay
        # and goes out when its requester re-sends the request (docs/messages.md).
        if answers:
            await self.outbox.acks.flush(2.0)

    # --- serving --------------------------------------------------------------------------

    async def _serve(self, served: Served, committed: Outgoing | None) -> None:
        if served.final:
            return  # canceled before its task ran (agent/lifecycle.py): it never starts
        CURRENT_REQUEST.set(served)  # this task's own context: the handler's progress()
        if served.slot:
            self.requests.move(served, ServedState.WORKING)  # its "started" row committed
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
        try:
            await self._send_answer(served, details)
        finally:
            if isinstance(details, NotStarted):
                self.requests.move(served, ServedState.EXPIRED)
            elif isinstance(details, CommandResult):
                self.requests.move(served, ServedState.COMPLETED)
            else:
                self.requests.move(served, ServedState.FAILED)

    def _finish(self, served: Served, answer: Outgoing) -> None:
        """Publish an answer whose "sent" row committed already, and close the command."""
        if served.answer_code is not None:
            self._metrics.commands_failed.inc(served.answer_code)
        self.requests.move(served, ServedState(served.answer_end))
        self.outbox.dispatch(answer)

    async def _send_answer(self, served: Served, details: CommandResult | CommandError) -> None:
        request = served.request
        if isinstance(details, CommandResult):
            kind = MSG_COMMAND_RESULT
        else:
            kind = MSG_COMMAND_ERROR
            self._metrics.commands_failed.inc(details.code)
        end = LedgerAction(ended_by(details))
        if isinstance(details, NotStarted):
            end = LedgerAction.EXPIRED
        with contextlib.suppress(VoxError):
            # The reply's "sent" row (with the reply in the outbox) is what marks the
            # command finished: from then on a restart re-sends the answer, never re-runs.
            # The "completed" or "failed" row commits in the same transaction.
            try:
                await self.outbox.send_message(
                    request.reply(kind, details),
                    expects_reply=False,
                    then=[(request, end, served.outcome_of(end))],
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
                await self.outbox.send_message(
                    request.reply(MSG_COMMAND_ERROR, too_large),
                    expects_reply=False,
                    then=[(request, LedgerAction.FAILED, None)],
                    answering=request,
                )
            except LedgerError:
                # It cannot be recorded (the disk is full): answer anyway, once.
                await self.outbox.publish_unrecorded(request.reply(kind, details))

    async def _answer(
        self, served: Served, committed: Outgoing | None
    ) -> CommandResult | CommandError:
        request, plan, handler = served.request, served.plan, served.handler
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
        if served.downstream is not None and served.child is not None:
            # Adopted after a restart (adopt): its child's answer is still due.
            child, timeout = served.child, self._timeout_of(payload)
            outcome = await self._delegation_outcome(served, timeout, started=time.perf_counter())
            if refused_unrecorded(outcome):
                return await self._delegate(
                    served, payload, timeout, refused={child}, outcome=outcome
                )
            return outcome
        if step is Step.DELEGATE and committed is not None and plan.child is not None:
            # Its downstream request committed with its "received" row: send it now.
            tracked = self.outbox.dispatch(committed)
            self.requests.delegate(served, plan.child, tracked)
            timeout = self._timeout_of(payload)
            outcome = await self._delegation_outcome(served, timeout, started=time.perf_counter())
            if refused_unrecorded(outcome):
                return await self._delegate(
                    served, payload, timeout, refused={plan.child}, outcome=outcome
                )
            return outcome
        if served.early is not None:
            return await served.early  # idempotent: its handler started while it committed
        if served.slot:
            # Its "started" row committed with its "received" one, its slot taken then.
            assert handler is not None  # a SERVE plan that starts at once names it
            return await self._run(handler, name, payload, self._timeout_of(payload))
        if step is Step.STOPPING or self.stopping:
            return CommandError(
                code=ErrorCode.SHUTTING_DOWN, error="agent is stopping", command=name
            )
        timeout = self._timeout_of(payload)
        if handler is not None:
            await self._handler_slots.acquire()
            served.slot = True
            if served.answering:  # canceled while it waited (agent/lifecycle.py): not started
                return CommandError(code=ErrorCode.CANCELED, error="canceled", command=name)
            await self._ledger.record_message(request, LedgerAction.STARTED)
            self.requests.move(served, ServedState.WORKING)
            return await self._run(handler, name, payload, timeout)
        return await self._delegate(served, payload, timeout)

    async def _run(
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

    def _timeout_of(self, payload: CommandRequest) -> float:
        # The caller's deadline, however far; request_timeout only for a request without one.
        return time_left(payload.deadline, self.config.request_timeout)

    async def _delegate(
        self,
        served: Served,
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
            if child is None:
                return self._unroutable(name, code or ErrorCode.NO_ROUTE)
            started = time.perf_counter()
            # The "delegated" row commits with the downstream request's "sent" row.
            tracked = await self.outbox.send_message(
                self._downstream(served.request, child),
                expects_reply=True,
                then=[(served.request, LedgerAction.DELEGATED, str(child))],
            )
            self.requests.delegate(served, child, tracked)
            outcome = await self._delegation_outcome(served, timeout, started=started)
            if not refused_unrecorded(outcome):
                return outcome
            # That child cannot record and did nothing: the work goes to another, if any.
            refused.add(child)

    def _unroutable(self, name: str, code: ErrorCode) -> CommandError:
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
            served = self.requests.open(request, Plan(step=Step.DELEGATE, child=child), None)
            self.requests.delegate(served, child, tracked)
            served.canceling = bool(row.get("canceling"))  # its cancel passed down already
            served.task = self._tasks.spawn(self._serve(served, None), "adopted")
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
            self._metrics.commands_failed.inc(ErrorCode.HANDLER_ERROR)
            await self._report_interrupted(row)
        for row in pending:
            request = request_from_row(row)
            if request is not None and request.source in self.config.peers:
                self.begin(request, *plan(request))
