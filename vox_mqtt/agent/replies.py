"""The executors of what comes back or comes unasked: acks, answers, copies, events.

Each has the executor table's shape (agent/executors.py). An answer settles the request it
names (the outbox's tracker) and then goes to the roles' event handlers, as an event does;
a child's event counts in that child's backlog until its handlers return (docs/security.md,
F25).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from vox_mqtt.agent.childbudget import CAUSE, FLOODING, ChildBudgets
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import (
    Answer,
    Duplicate,
    Event,
    Late,
    RelayAnswer,
    Replay,
    SettleAck,
)
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.prepared import Staged, Taken, nothing_recorded, relayed_details
from vox_mqtt.agent.refusals import Refusals
from vox_mqtt.agent.roles import Handler
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.ledger.actions import LedgerAction, row_of
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.messages import MessageAcknowledged, VOXMessage

__all__ = [
    "AnswerStep",
    "DuplicateStep",
    "EventStep",
    "LateStep",
    "RelayAnswerStep",
    "ReplayStep",
    "RoleHandoff",
    "SettleAckStep",
]

log = logging.getLogger("vox_mqtt.agent")


class RoleHandoff:
    """Settle the request a reply names, then give the message to the roles' event handlers."""

    def __init__(
        self,
        *,
        settings: Settings,
        router: Router,
        outbox: Outbox,
        tasks: TaskSet,
        budgets: ChildBudgets | None,
    ) -> None:
        self._settings = settings
        self._router = router
        self._outbox = outbox
        self._tasks = tasks
        self.budgets = budgets
        self.flooding: Callable[[UUID, str], None] | None = None  # the agent's (facade)

    def hand_on(self, message: VOXMessage) -> None:
        """Settle a reply's request (a no-op when settled already) and run the handlers."""
        if message.reply_to is not None:
            self._outbox.settle_reply(message)
        children = self._settings().children
        child = message.source if message.source in children else None
        for handler in self._router.event_handlers(message.type):
            if child is not None and self.budgets is not None:
                self.budgets.started(child)  # in its backlog until the handler returns
            self._tasks.spawn(self._run(handler, message, child), f"event-{message.type}")

    async def _run(self, handler: Handler, message: VOXMessage, child: UUID | None) -> Any:
        # What the handler sends counts in the child's backlog until acknowledged (outbox).
        CAUSE.set(child)
        try:
            await handler(message)
        except Exception:
            log.exception("%s: %s handler failed", self._settings().name, message.type)
        finally:
            self.done_with(child)

    def done_with(self, child: UUID | None) -> None:
        """A child's message (or one of its handlers) is done: out of its backlog."""
        if child is not None and self.budgets is not None:
            self.budgets.finished(child)


class EventStep:
    """An event (or an answer nobody awaits): recorded, acknowledged, given to the roles.

    A child's event is admitted within its rate and backlog first: over them it is refused
    unrecorded and unacknowledged, and its sender re-sends it later (docs/security.md, F25).
    """

    def __init__(self, *, settings: Settings, roles: RoleHandoff, metrics: AgentMetrics) -> None:
        self._settings = settings
        self._roles = roles
        self._metrics = metrics

    async def stage(self, taken: Taken, plan: Event) -> Staged:
        source = taken.message.source
        if source not in self._settings().children or self._roles.budgets is None:
            return Staged()
        if self._over_budget(self._roles.budgets, source):
            return nothing_recorded()  # unacknowledged: its sender keeps it and re-sends it
        return Staged(cause=source)

    def _over_budget(self, budgets: ChildBudgets, child: UUID) -> bool:
        """Tell whether a child's event is over its rate or backlog: refused, counted, posted.

        Within them, it counts in the child's backlog until handled.
        """
        config = self._settings()
        problem, report = budgets.admit(
            child, now=time.monotonic(), rate=config.child_rate, backlog=config.child_backlog
        )
        if problem is None:
            budgets.started(child)
            return False
        self._metrics.rejected.inc(FLOODING)
        if report:
            name = config.children.get(child, str(child))
            log.warning("%s: refusing events of %s for now: %s", config.name, name, problem)
            if self._roles.flooding is not None:
                self._roles.flooding(child, problem)
        return True

    async def execute(self, taken: Taken, plan: Event, staged: Staged) -> None:
        if not staged.commits:
            return
        try:
            self._roles.hand_on(taken.message)
        finally:
            self._roles.done_with(staged.cause)

    def drop(self, taken: Taken, plan: Event, staged: Staged) -> None:
        self._roles.done_with(staged.cause)


class AnswerStep:
    """An answer a caller here awaits: the caller sees it beside the commit of its record.

    The ack (when one is owed) waits for that commit, so the answerer re-sends until the
    answer is durable here (docs/ledger.md, rows that commit together); the ledger keeps
    the order: whatever the caller records next commits after this row.
    """

    def __init__(self, *, outbox: Outbox, roles: RoleHandoff) -> None:
        self._outbox = outbox
        self._roles = roles

    async def stage(self, taken: Taken, plan: Answer) -> Staged:
        message = taken.message
        return Staged(beside=lambda: self._outbox.settle_reply(message))

    async def execute(self, taken: Taken, plan: Answer, staged: Staged) -> None:
        self._roles.hand_on(taken.message)

    def drop(self, taken: Taken, plan: Answer, staged: Staged) -> None:
        """Nothing was taken for it."""


class RelayAnswerStep:
    """A child's answer to a command delegated from here: this agent's answer commits with it.

    One commit on the way up instead of two (docs/ledger.md); if the command is no longer
    awaited here, or its answer cannot be sent as it is, the runner's task answers it.
    """

    def __init__(self, *, runner: CommandRunner, roles: RoleHandoff) -> None:
        self._runner = runner
        self._roles = roles

    async def stage(self, taken: Taken, plan: RelayAnswer) -> Staged:
        reply = taken.message
        assert reply.reply_to is not None
        runner = self._runner
        served = runner.requests.relaying(reply.reply_to)
        if served is None or not runner.requests.claim_answer(served):
            return Staged()  # no longer awaited here: the runner's task answers
        name = str(served.request.details.get("command", ""))
        details = relayed_details(reply, name, handled_by=runner.config.id)
        outgoing = None if details is None else runner.prepared_answer(served, details)
        if outgoing is None:
            runner.requests.release_answer(served)  # the runner's task answers it (too large)
            return Staged()
        runner.requests.relaying_answer(served)
        staged = Staged(relayed=served, outgoing=outgoing)
        staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        end = served.answer_end
        assert end is not None, "prepared with its answer (answer_prepared)"
        staged.rows.append((served.request, row_of(end), served.outcome_of(end)))
        return staged

    async def execute(self, taken: Taken, plan: RelayAnswer, staged: Staged) -> None:
        if staged.relayed is not None:
            self._runner.requests.answer_committed(staged.relayed, True)
        self._roles.hand_on(taken.message)

    def drop(self, taken: Taken, plan: RelayAnswer, staged: Staged) -> None:
        if (relayed := staged.relayed) is not None:
            self._runner.requests.answer_unprepared(relayed)


class LateStep:
    """An answer to a request that already ended here: recorded late, never its outcome."""

    def __init__(self, *, settings: Settings, ledger: VOXAgentMemory) -> None:
        self._settings = settings
        self._ledger = ledger

    async def stage(self, taken: Taken, plan: Late) -> Staged:
        return Staged()

    async def execute(self, taken: Taken, plan: Late, staged: Staged) -> None:
        message = taken.message
        log.info("%s: a late %s: %s", self._settings().name, message.type, plan.reason)
        await self._ledger.record_message(
            message, LedgerAction.LATE, outcome=plan.ended, reason=plan.reason
        )

    def drop(self, taken: Taken, plan: Late, staged: Staged) -> None:
        """Nothing was taken for it."""


class SettleAckStep:
    """An ack of a message this agent sent: its re-sending stops at once.

    Nothing waits for the ack's row: it joins the next commit with the sent message's
    removal from the outbox (a command_request stays there until answered).
    """

    def __init__(
        self,
        *,
        outbox: Outbox,
        refusals: Refusals,
        leaves_outbox: Callable[[UUID], UUID | None],
    ) -> None:
        self._outbox = outbox
        self._refusals = refusals
        self._leaves_outbox = leaves_outbox

    async def stage(self, taken: Taken, plan: SettleAck) -> Staged:
        message = taken.message
        done = message.payload_as(MessageAcknowledged).in_response_to
        if self._refusals.unrecorded_ack(done):
            return nothing_recorded()  # the ack of an unrecorded report: unrecorded too
        return Staged(
            later=True,
            outbox_done=self._leaves_outbox(done),
            beside=lambda: self._outbox.settle_ack(message),
        )

    async def execute(self, taken: Taken, plan: SettleAck, staged: Staged) -> None:
        """Settled beside its commit already."""

    def drop(self, taken: Taken, plan: SettleAck, staged: Staged) -> None:
        """Nothing was taken for it."""


class DuplicateStep:
    """A copy of a message recorded already: recorded `duplicate`, never acted on again."""

    def __init__(self, *, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    async def stage(self, taken: Taken, plan: Duplicate) -> Staged:
        return Staged(action=LedgerAction.DUPLICATE)

    async def execute(self, taken: Taken, plan: Duplicate, staged: Staged) -> None:
        self._metrics.duplicates += 1

    def drop(self, taken: Taken, plan: Duplicate, staged: Staged) -> None:
        """Nothing was taken for it."""


class ReplayStep:
    """A re-sent command answered here: the answer recorded goes again, same id.

    Its requester lacks the answer; nothing runs again (docs/messages.md, "Answers need
    no acknowledgement").
    """

    def __init__(self, *, outbox: Outbox, metrics: AgentMetrics) -> None:
        self._outbox = outbox
        self._metrics = metrics

    async def stage(self, taken: Taken, plan: Replay) -> Staged:
        return Staged(action=LedgerAction.DUPLICATE)

    async def execute(self, taken: Taken, plan: Replay, staged: Staged) -> None:
        self._metrics.duplicates += 1
        self._outbox.acks.replay(plan.answer)

    def drop(self, taken: Taken, plan: Replay, staged: Staged) -> None:
        """Nothing was taken for it."""
