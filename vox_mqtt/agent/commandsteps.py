"""The executors of a command_request's plans: serve it here, delegate it, answer it at once.

Each has the executor table's shape (agent/executors.py: stage, execute, drop) for the
inbound commit that accepts the command, and one more step, `answer`, which the runner's
task for the command awaits (agent/runner.py `CommandRunner.serve`): what the answer is,
as this plan carries it out. An `answer` that learns a fact the plan did not know returns
`Redecide` with it, and the runner asks `plan.decide_command` again; none of them picks a
child or looks at another plan.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from uuid import UUID

from vox_mqtt.agent.outbox import Outgoing
from vox_mqtt.agent.plan import (
    CanceledBefore,
    Delegate,
    Expired,
    Serve,
    Stopping,
    Unroutable,
)
from vox_mqtt.agent.prepared import NotStarted, Staged, Taken, refused_unrecorded
from vox_mqtt.agent.requests import CURRENT_REQUEST, Served
from vox_mqtt.ledger.actions import LedgerAction, row_of
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    CommandError,
    CommandRequest,
    CommandResult,
    ErrorCode,
    VOXMessage,
)

if TYPE_CHECKING:
    from vox_mqtt.agent.outbox import Outbox
    from vox_mqtt.agent.requests import Requests
    from vox_mqtt.agent.roles import Handler
    from vox_mqtt.protocol.settings import AgentConfig

__all__ = [
    "QUICK_ANSWER_WINDOW",
    "AnsweredAtOnce",
    "CommandRunner",
    "CommandStep",
    "DelegateStep",
    "Redecide",
    "ServeStep",
    "answered_at_once",
]

# How long an idempotent command may take for its answer to commit with its record and stand
# for its acknowledgement (docs/messages.md, acknowledgements). A slower one is acknowledged
# as usual once its record commits; the wait delays nothing else.
QUICK_ANSWER_WINDOW = 0.005

Outcome = CommandResult | CommandError
P = TypeVar("P")
Q = TypeVar("Q", contravariant=True)


@dataclass(frozen=True, kw_only=True)
class Redecide:
    """A fact the plan did not know: decide again (plan.decide_command) and carry that out."""

    refused_by: UUID | None = None  # a child refused the work unrecorded: it did nothing
    refusal: CommandError | None = None  # its refusal, the answer if no other child can


class CommandRunner(Protocol):
    """What the executors of a command's plans use of the runner (agent/runner.py)."""

    outbox: Outbox
    requests: Requests
    stopping: bool

    @property
    def config(self) -> AgentConfig: ...

    def begin(self, staged: Staged) -> None: ...

    def forget(self, staged: Staged) -> None: ...

    async def take_slot(self, served: Served) -> None: ...

    async def record_start(self, served: Served) -> None: ...

    async def run(
        self, handler: Handler, name: str, payload: CommandRequest, timeout: float
    ) -> Outcome: ...

    def timeout_of(self, payload: CommandRequest) -> float: ...

    def prepared_answer(self, served: Served, details: Outcome) -> Outgoing | None: ...

    def ended_at_once(self, end: LedgerAction, code: str | None) -> None: ...

    def downstream(self, request: VOXMessage, child: UUID) -> VOXMessage: ...

    async def delegation_outcome(
        self, served: Served, timeout: float, *, started: float
    ) -> Outcome: ...

    def unroutable(self, name: str, code: ErrorCode) -> CommandError: ...


class CommandStep(Protocol[Q]):
    """An executor of a command's plan: the table's three steps, and the command's answer."""

    async def stage(self, taken: Taken, plan: Q) -> Staged: ...

    async def execute(self, taken: Taken, plan: Q, staged: Staged) -> None: ...

    def drop(self, taken: Taken, plan: Q, staged: Staged) -> None: ...

    async def answer(
        self, served: Served, plan: Q, committed: Outgoing | None
    ) -> Outcome | Redecide: ...


class ServeStep:
    """Serve a command with a role's handler here: at once, early, or when a slot frees."""

    def __init__(self, runner: CommandRunner) -> None:
        self._runner = runner

    async def stage(self, taken: Taken, plan: Serve) -> Staged:
        runner = self._runner
        served = runner.requests.open(taken.message, plan)
        staged = Staged(served=served)
        if not plan.start_now:
            return staged
        # The slot is free, as the plan found: taking it returns at once, and the command's
        # "started" row commits with its "received" one.
        await runner.take_slot(served)
        staged.rows.append((served.request, LedgerAction.STARTED, None))
        if plan.run_early:
            await self._start_early(served, plan, staged)
        return staged

    async def _start_early(self, served: Served, plan: Serve, staged: Staged) -> None:
        # Idempotent: its handler runs while its record commits; answered within the window,
        # one commit holds its record, start, answer (whole in the outbox) and end, and the
        # answer, sent once that is durable, is its acknowledgement (docs/messages.md).
        runner = self._runner
        payload = served.request.payload_as(CommandRequest)
        context = contextvars.copy_context()  # the handler's progress() finds its command
        context.run(CURRENT_REQUEST.set, served)
        running = asyncio.get_running_loop().create_task(
            runner.run(plan.handler, payload.command, payload, runner.timeout_of(payload)),
            context=context,
        )
        runner.requests.started_early(served, running)
        # Waited for, not shielded and timed out: asyncio.wait neither cancels it nor needs a
        # task or callbacks of its own (fewer turns of the loop, docs/performance.md).
        await asyncio.wait({running}, timeout=QUICK_ANSWER_WINDOW)
        if not running.done() or running.cancelled() or running.exception() is not None:
            return  # slower: its record commits now, and its answer later, as usual
        outgoing = runner.prepared_answer(served, running.result())
        if outgoing is not None:
            assert served.answer_end is not None, "prepared with its answer (answer_prepared)"
            staged.outgoing, staged.implied = outgoing, True
            staged.rows.append((outgoing.message, LedgerAction.SENT, None))
            staged.rows.append((served.request, row_of(served.answer_end), None))

    async def execute(self, taken: Taken, plan: Serve, staged: Staged) -> None:
        self._runner.begin(staged)

    def drop(self, taken: Taken, plan: Serve, staged: Staged) -> None:
        self._runner.forget(staged)

    async def answer(
        self, served: Served, plan: Serve, committed: Outgoing | None
    ) -> Outcome | Redecide:
        runner = self._runner
        payload = served.request.payload_as(CommandRequest)
        name, timeout = payload.command, runner.timeout_of(payload)
        if served.early is not None:
            return await served.early  # idempotent: its handler started while it committed
        if served.slot:
            # Its "started" row committed with its "received" one, its slot taken then.
            return await runner.run(plan.handler, name, payload, timeout)
        if runner.stopping:
            return Redecide()  # it waited for a slot while the agent began stopping
        await runner.take_slot(served)
        if served.answering:  # canceled while it waited (agent/lifecycle.py): not started
            return CommandError(code=ErrorCode.CANCELED, error="canceled", command=name)
        await runner.record_start(served)
        return await runner.run(plan.handler, name, payload, timeout)


class DelegateStep:
    """Send a command on to the child the plan chose, and answer for the child's answer."""

    def __init__(self, runner: CommandRunner) -> None:
        self._runner = runner

    async def stage(self, taken: Taken, plan: Delegate) -> Staged:
        # Its downstream request and "delegated" row commit with its "received" row: one
        # commit on the way down instead of two (docs/ledger.md).
        runner = self._runner
        served = runner.requests.open(taken.message, plan)
        staged = Staged(served=served)
        try:
            outgoing = runner.outbox.prepare(
                runner.downstream(served.request, plan.child), expects_reply=True
            )
        except VoxError:
            return staged  # too large to send: its answer says why (answer, below)
        staged.outgoing = outgoing
        staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        staged.rows.append((served.request, LedgerAction.DELEGATED, str(plan.child)))
        return staged

    async def execute(self, taken: Taken, plan: Delegate, staged: Staged) -> None:
        self._runner.begin(staged)

    def drop(self, taken: Taken, plan: Delegate, staged: Staged) -> None:
        self._runner.forget(staged)

    async def answer(
        self, served: Served, plan: Delegate, committed: Outgoing | None
    ) -> Outcome | Redecide:
        runner = self._runner
        started = time.perf_counter()
        if served.downstream is None:
            if committed is not None:
                # Its downstream request committed with its "received" row: send it now.
                tracked = runner.outbox.dispatch(committed)
            else:
                # Decided again (another child), or its record held none: the "delegated"
                # row commits with the downstream request's "sent" row.
                tracked = await runner.outbox.send_message(
                    runner.downstream(served.request, plan.child),
                    expects_reply=True,
                    then=[(served.request, LedgerAction.DELEGATED, str(plan.child))],
                )
            runner.requests.delegate(served, plan.child, tracked)
        # else: adopted after a restart (CommandRunner.adopt): its child's answer is still due.
        payload = served.request.payload_as(CommandRequest)
        outcome = await runner.delegation_outcome(
            served, runner.timeout_of(payload), started=started
        )
        if refused_unrecorded(outcome):
            # That child cannot record and did nothing: the work goes to another, if any.
            assert isinstance(outcome, CommandError)
            return Redecide(refused_by=plan.child, refusal=outcome)
        return outcome


Say = Callable[[VOXMessage, P, Served | None], CommandError]


class AnsweredAtOnce(Generic[P]):
    """Answer a command that never starts here, in the commit that records it.

    Past its deadline, unroutable, arriving while the agent stops, or canceled before it
    came: its answer and end row commit with its "received" row, and the answer, sent once
    that is durable, stands for its acknowledgement (docs/messages.md). Decided again for a
    command recorded already (the agent began stopping, every child refused it), the same
    answer goes as any answer does (CommandRunner.serve).
    """

    def __init__(
        self, runner: CommandRunner, say: Say[P], *, end: LedgerAction, counted: bool
    ) -> None:
        self._runner = runner
        self._say = say  # what the answer says
        self._end = end  # the command's end row: expired, failed or canceled
        self._counted = counted  # a failure commands_failed counts (a cancel is not)

    async def stage(self, taken: Taken, plan: P) -> Staged:
        request = taken.message
        error = self._say(request, plan, None)
        staged = Staged(answer_code=error.code if self._counted else None)
        try:
            outgoing = self._runner.outbox.prepare(
                request.reply(MSG_COMMAND_ERROR, error), answering=request
            )
        except VoxError:
            outgoing = None  # no longer a peer (the fleet changed): recorded, not answered
        if outgoing is not None:
            staged.outgoing, staged.implied = outgoing, True
            staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        staged.rows.append((request, self._end, error.code))
        return staged

    async def execute(self, taken: Taken, plan: P, staged: Staged) -> None:
        self._runner.ended_at_once(self._end, staged.answer_code)
        if staged.outgoing is not None:
            self._runner.outbox.dispatch(staged.outgoing)

    def drop(self, taken: Taken, plan: P, staged: Staged) -> None:
        """Nothing was taken for it: nothing to give back."""

    async def answer(self, served: Served, plan: P, committed: Outgoing | None) -> Outcome:
        return self._say(served.request, plan, served)


def answered_at_once(runner: CommandRunner) -> dict[type, CommandStep[Any]]:
    """The executors of the plans answered at once, each with what its answer says."""

    def name_of(request: VOXMessage) -> str:
        return request.payload_as(CommandRequest).command

    def expired(request: VOXMessage, plan: Expired, served: Served | None) -> CommandError:
        # Its master gave up at that deadline: running it now would be work nobody awaits
        # (a re-delivery, a queue that held it, a restart in between).
        name = name_of(request)
        why = f"{name!r} reached {runner.config.name} after its deadline: not started"
        return NotStarted(code=ErrorCode.TIMEOUT, error=why, command=name)

    def stopping(request: VOXMessage, plan: Stopping, served: Served | None) -> CommandError:
        name = name_of(request)
        return CommandError(code=ErrorCode.SHUTTING_DOWN, error=plan.reason, command=name)

    def canceled(request: VOXMessage, plan: CanceledBefore, served: Served | None) -> CommandError:
        why = "canceled by its master before it came"
        return CommandError(code=ErrorCode.CANCELED, error=why, command=name_of(request))

    def unroutable(request: VOXMessage, plan: Unroutable, served: Served | None) -> CommandError:
        if served is not None and served.refusal is not None:
            return served.refusal  # every child that could have served it refused it unrecorded
        return runner.unroutable(name_of(request), plan.code)

    failed = LedgerAction.FAILED
    return {
        Expired: AnsweredAtOnce(runner, expired, end=LedgerAction.EXPIRED, counted=True),
        Stopping: AnsweredAtOnce(runner, stopping, end=failed, counted=True),
        CanceledBefore: AnsweredAtOnce(runner, canceled, end=LedgerAction.CANCELED, counted=False),
        Unroutable: AnsweredAtOnce(runner, unroutable, end=failed, counted=True),
    }
