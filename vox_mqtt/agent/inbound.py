"""The inbound pipeline, per message: parse, admit, dedupe, plan, commit, ack, hand on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from vox_mqtt.agent.answerguard import AnswerGuard
from vox_mqtt.agent.childbudget import ChildBudgets
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.executors import executor_table
from vox_mqtt.agent.lifecycle import Lifecycle
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import (
    ANSWERS,
    Admission,
    Answered,
    AnswerFacts,
    CancelFacts,
    CommandFacts,
    CommandPlan,
    Facts,
    Local,
    Plan,
    Waiter,
    acts,
    admit,
    decide,
    decide_command,
    shown,
)
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.prepared import Staged, Taken
from vox_mqtt.agent.refusals import Refusals
from vox_mqtt.agent.replies import RoleHandoff
from vox_mqtt.agent.roles import is_idempotent
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.agent.sendrules import awaits_answer, deadline_passed
from vox_mqtt.agent.tracking import RequestTracker, SentState
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.acks import acknowledge
from vox_mqtt.protocol.errors import InvalidMessage, LedgerError, TopicError
from vox_mqtt.protocol.lifecycle import (
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
    CancelRequest,
)
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    CommandRequest,
    ErrorCode,
    VOXMessage,
    parse,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.sitelinks import parse_link_topic
from vox_mqtt.transport.session import Inbound, Session

__all__ = ["InboundPipeline", "Listener", "Observed"]

log = logging.getLogger("vox_mqtt.agent")
COMPLETED = SentState.COMPLETED
SENDER_ENDS = frozenset(
    {LedgerAction.EXPIRED, LedgerAction.FAILED}
)  # how a request this agent sent can end
# Their plan needs no answer facts (a progress names its request in reply_to, as answers do).
_LIFECYCLE_TYPES = frozenset({MSG_COMMAND_PROGRESS, MSG_STATUS_QUERY})

Listener = Callable[[VOXMessage], Awaitable[None] | None]
Observed = Callable[[Inbound, topics.StatusTopic | topics.WarroomTopic], Awaitable[None]]


class InboundPipeline:
    """Take every message the session delivers; a peer's message is durable before its ack."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: VOXAgentMemory,
        session: Session,
        tracker: RequestTracker,
        metrics: AgentMetrics,
        tasks: TaskSet,
        outbox: Outbox,
        runner: CommandRunner,
        lifecycle: Lifecycle,
        router: Router,
        observed: Observed,
        linked: Callable[[Inbound], None] | None = None,
        budgets: ChildBudgets | None = None,
        flooding: Callable[[UUID, str], None] | None = None,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._session = session
        self._tracker = tracker
        self._metrics = metrics
        self._tasks = tasks
        self.outbox = outbox
        self.runner = runner
        self.lifecycle = lifecycle  # cancel, status and progress (agent/lifecycle.py)
        self.router = router
        self.observed = observed  # status and war-room messages go to liveness
        self.linked = linked  # bridge link states, in a federated fleet (sitelinks.py)
        self.listeners: list[Listener] = []  # see every verified inbound message
        # What is refused, and what a peer's refusals may cost the ledger (agent/refusals.py).
        self._refusals = Refusals(
            settings=settings, ledger=ledger, metrics=metrics, outbox=outbox, lifecycle=lifecycle
        )
        # Each child's event rate and backlog (docs/security.md, F25); a child over its
        # limits is told to `flooding` (a war-room incident).
        roles = RoleHandoff(
            settings=settings, router=router, outbox=outbox, tasks=tasks, budgets=budgets
        )
        roles.flooding = flooding
        self._executors = executor_table(
            settings=settings,
            ledger=ledger,
            metrics=metrics,
            outbox=outbox,
            runner=runner,
            lifecycle=lifecycle,
            refusals=self._refusals,
            roles=roles,
            leaves_outbox=self._leaves_outbox,
        )
        runner.planner = self.plan_command
        # Inbox messages wait here for one of max_intake workers: no task per message. The
        # workers start as messages need them (an idle agent holds one, not max_intake).
        self._intake_queue: asyncio.Queue[tuple[Inbound, topics.InboxTopic]] = asyncio.Queue(
            settings().max_intake
        )
        self._workers = 0
        self._idle_workers = 0  # started, and waiting for a message (or about to)
        self._in_progress: dict[UUID, asyncio.Event] = {}
        self._answers = AnswerGuard(
            settings=settings, ledger=ledger, tracker=tracker, metrics=metrics
        )
        self.intake = 0  # inbound messages being recorded, acknowledged and routed
        self._taken_in = asyncio.Event()  # set while no message is in intake
        self._taken_in.set()
        metrics.gauge("intake_queue", self._waiting)

    def _waiting(self) -> int:
        """Return the messages received and not yet routed: queued in the session or in intake."""
        return self.intake + self._session.queued

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self._settings()

    async def run(self) -> None:
        """Read the session's messages until it ends; up to max_intake workers take the inbox's."""
        async for inbound in self._session.messages():
            if self.linked is not None and parse_link_topic(inbound.topic) is not None:
                self.linked(inbound)
                continue
            try:
                topic = topics.parse_topic(inbound.topic)
            except TopicError as exc:
                log.warning("%s: ignoring %s", self.config.name, exc)
                continue
            if isinstance(topic, topics.StatusTopic | topics.WarroomTopic):
                await self.observed(inbound, topic)
            else:
                self.intake += 1
                self._taken_in.clear()
                if self._intake_queue.qsize() >= self._idle_workers:
                    self._add_worker()  # every queued message has a worker to take it
                # Full: every worker is busy and max_intake wait; the session's queue holds
                # the rest, and its PUBACKs wait with them (backpressure, docs/transport.md).
                await self._intake_queue.put((inbound, topic))

    def _add_worker(self) -> None:
        if self._workers < self.config.max_intake:
            self._workers += 1
            self._idle_workers += 1
            self._tasks.spawn(self._intake_worker(), f"intake-{self._workers - 1}")

    async def _intake_worker(self) -> None:
        while True:
            inbound, topic = await self._intake_queue.get()
            self._idle_workers -= 1
            try:
                await self._process(inbound, topic)
            except Exception:
                # Nothing a peer sends may stop the agent: log it and go on.
                log.exception(
                    "%s: failed to process a message on %s", self.config.name, inbound.topic
                )
            finally:
                self._idle_workers += 1
                self.intake -= 1
                if self.intake == 0:
                    self._taken_in.set()

    async def drain(self, timeout: float) -> None:
        """Wait (up to timeout) for the messages already taken in to be recorded and acked.

        A caller may hold its answer before the answer's commit (docs/ledger.md); its ack
        follows the commit, and the agent must not leave before it is at least queued.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._taken_in.wait()

    async def _process(self, inbound: Inbound, topic: topics.InboxTopic) -> None:
        """Parse, admit, decide, stage, commit, execute: one inbox message."""
        message = await self._parsed(inbound, topic)
        if message is None:
            return
        taken = Taken(message, inbound, topic)
        config = self.config
        admission = Admission(
            me=config.id,
            master_id=config.master_id,
            peers=config.peers,
            retained=inbound.retain,
            write_failure=self._ledger.write_failure,
        )
        refusal = admit(message, topic, admission)
        if refusal is not None:
            await self._carry_out(taken, refusal)
            return
        # Only the agent a request went to may answer, acknowledge or report on it (F24).
        if await self._answers.refused(message, inbound.topic, inbound.payload):
            return
        # It is there: what was held back for it goes now (F25).
        self.outbox.deliveries.heard_from(message.source)
        await self._decide_and_carry_out(taken)

    async def _parsed(self, inbound: Inbound, topic: topics.InboxTopic) -> VOXMessage | None:
        """The message, parsed; None when refused before (forged, unparsable, stale)."""
        if inbound.forgery is not None:  # the session's verdict, before parse (docs/security.md)
            await self._refusals.forged(inbound, topic, inbound.forgery)
            return None
        try:
            message = parse(inbound.payload, max_bytes=self.config.max_message_bytes)
        except InvalidMessage as exc:
            await self._refusals.unparsable(inbound, topic, exc)
            return None
        if await self._refusals.stale(inbound, message):
            return None
        return message

    async def _decide_and_carry_out(self, taken: Taken) -> None:
        """Dedupe, decide and carry out an admitted message; a peer's is durable before its ack.

        QoS 1 and our own re-sends deliver duplicates: re-ack, never re-execute. The
        in-progress map is checked and filled with no await between, so two copies arriving
        together cannot both pass the ledger check; a copy of a message still being recorded
        waits for that record, so no ack ever precedes durability.
        """
        ledger, message = self._ledger, taken.message
        message_id = message.message_id
        recording = self._in_progress.get(message_id)
        if recording is not None:
            await recording.wait()
            if not await ledger.has_message(message_id, emitted_at=message.emitted_at):
                return  # the first copy failed to record; the sender will re-send
            await self._carry_out(taken, decide(message, await self._duplicate_facts(message)))
            return
        recording = self._in_progress[message_id] = asyncio.Event()
        try:
            if await ledger.has_message(message_id, emitted_at=message.emitted_at):
                facts = await self._duplicate_facts(message)
            else:
                facts = await self._facts(taken)
            plan = decide(message, facts)  # the one decision about this message
            staged = await self._stage_and_commit(taken, plan)
        finally:
            del self._in_progress[message_id]
            recording.set()
        if staged is not None:
            await self._execute(taken, plan, staged)

    async def _carry_out(self, taken: Taken, plan: Plan) -> None:
        staged = await self._stage_and_commit(taken, plan)
        if staged is not None:
            await self._execute(taken, plan, staged)

    async def _stage_and_commit(self, taken: Taken, plan: Plan) -> Staged | None:
        """Stage a plan with its executor and commit what it staged; None: the commit failed.

        One commit per inbound message: its row, the "sent" row of its ack, and the rows its
        plan adds; docs/ledger.md says what a restart proves of each group.
        """
        executor = self._executors.of(plan)
        staged = await executor.stage(taken, plan)
        if not staged.commits:
            return staged
        message = taken.message
        ack = None
        if plan.acknowledge and not staged.implied:
            ack = acknowledge(message, message_source=self.config.message_source)
        try:
            await self._commit(taken, staged, ack)
        except LedgerError as exc:
            executor.drop(taken, plan, staged)
            await self._refusals.unrecordable(message, str(exc))
            return None
        except BaseException:
            executor.drop(taken, plan, staged)
            raise
        staged.ack = ack
        return staged

    async def _commit(self, taken: Taken, staged: Staged, ack: VOXMessage | None) -> None:
        message, ledger = taken.message, self._ledger
        if staged.later:
            # Nothing waits for its row: it joins the next commit.
            row = ledger.record_received_later(
                message, topic=taken.topic, outbox_done=staged.outbox_done
            )
            if staged.beside is not None:
                staged.beside()
            await row
            return
        done = staged.outbox_done
        if done is None and staged.action is LedgerAction.RECEIVED and message.type in ANSWERS:
            # A reply proves its request arrived: the request leaves the outbox with this
            # commit even when no acknowledgement of it came (an answer that stands for one).
            done = message.reply_to
        kept = staged.outgoing
        await ledger.record_message(
            message,
            staged.action,
            outcome=staged.outcome,
            reason=staged.reason,
            topic=taken.topic,
            then=[*([] if ack is None else [(ack, LedgerAction.SENT, None)]), *staged.rows],
            outbox=None if kept is None else kept.outbox,
            outbox_for=None if kept is None else kept.message,
            outbox_done=done,
            replay_until=None if kept is None else kept.replay_until,
            # What may happen before the commit is durable happens beside it, once its rows
            # are queued (docs/ledger.md): no task of its own.
            queued=staged.beside,
        )

    async def _execute(self, taken: Taken, plan: Plan, staged: Staged) -> None:
        """Carry out a plan whose commit is durable: its ack, the listeners, its executor."""
        message = taken.message
        if staged.commits and acts(plan):
            self._metrics.messages_in.inc(message.type)
        if staged.ack is not None:
            # The record is durable, so the ack may go; routing need not wait for its PUBACK.
            self.outbox.acks.soon(message, staged.ack)
        if staged.commits and shown(plan):
            for listener in self.listeners:
                outcome = listener(message)
                if outcome is not None:
                    await outcome
        await self._executors.of(plan).execute(taken, plan, staged)

    def _leaves_outbox(self, acknowledged: UUID) -> UUID | None:
        """Return the sent message an ack takes out of the outbox: None for a command_request.

        A command_request stays there until its answer is recorded (or it ends): a restart
        re-sends it until answered, as the answer is never acknowledged (docs/ledger.md).
        """
        tracked = self._tracker.get(acknowledged)
        if tracked is not None and awaits_answer(tracked.message):
            return None
        return acknowledged

    async def _duplicate_facts(self, message: VOXMessage) -> Facts:
        """What deciding a copy of a recorded message reads; with a command's held answer."""
        if message.type == MSG_COMMAND_REQUEST:
            found = await self._ledger.held_answer(message.message_id)
            held, until = (None, None) if found is None else found
            # A CANCELED answer goes once the handler its cancel cut has ended, never before
            # (agent/lifecycle.py): until then a copy of the request gets nothing.
            withheld = self.lifecycle.cut_running(message.message_id)
            state = answered(until, time.time())
            return Facts(duplicate=True, answered=state, held=held, withheld=withheld)
        if message.type in ANSWERS and message.reply_to is not None:
            to_command = await self._sent_command(message.reply_to)
            answer = AnswerFacts(waiter=Waiter.NOBODY, to_command=to_command)
            return Facts(duplicate=True, answer=answer)
        return Facts(duplicate=True)

    async def _sent_command(self, request_id: UUID) -> bool:
        """Tell whether this agent sent a command_request under this id (tracker, else ledger)."""
        tracked = self._tracker.get(request_id)
        if tracked is not None:
            return tracked.message.type == MSG_COMMAND_REQUEST
        return _sent_command_in(await self._ledger.find(request_id), str(self.config.id))

    async def _facts(self, taken: Taken) -> Facts:
        """Gather what the plan of a message reads; the router is consulted here, once."""
        message = taken.message
        if message.type == MSG_COMMAND_REQUEST:
            return Facts(command=self._command_facts(message, slot_free=self.runner.slot_free))
        if message.type == MSG_CANCEL_REQUEST:
            named = message.payload_as(CancelRequest).request_id
            target = await self.lifecycle.cancel_target(named)
            # Remembering a cancel of a request never received costs its sender's budget.
            allowed = target != "unknown" or self._refusals.unknown_cancel_allowed(
                taken.inbox.source
            )
            return Facts(cancel=CancelFacts(target=target, within_budget=allowed))
        if message.type in _LIFECYCLE_TYPES or message.reply_to is None:
            return Facts()
        return Facts(answer=await self._answer_facts(message.reply_to, message))

    def _command_facts(
        self, message: VOXMessage, *, slot_free: bool, refused_by: frozenset[UUID] = frozenset()
    ) -> CommandFacts:
        """What deciding a command reads: the router, consulted once, and the runner's state."""
        runner = self.runner
        name = message.payload_as(CommandRequest).command
        handler = self.router.command_handler(name)
        local = Local.NONE
        if handler is not None:
            local = Local.IDEMPOTENT if is_idempotent(handler) else Local.PLAIN
        return CommandFacts(
            command=name,
            deadline_passed=deadline_passed(message),
            stopping=runner.stopping,
            slot_free=slot_free,
            local=local,
            handler=handler,
            children=runner.children() if handler is None else (),
            load=runner.load,
            canceled_before=self.lifecycle.canceled_before(message.message_id),
            refused_by=refused_by,
        )

    def plan_command(self, message: VOXMessage, refused_by: frozenset[UUID]) -> CommandPlan:
        """Decide a recorded command again (CommandRunner.decided): after a restart, or on a
        new fact (the agent began stopping, children refused it unrecorded).

        Its record committed already, so nothing starts with it: no slot is taken at once
        and nothing runs early.
        """
        facts = self._command_facts(message, slot_free=False, refused_by=refused_by)
        return decide_command(facts)

    async def _answer_facts(self, request_id: UUID, reply: VOXMessage) -> AnswerFacts:
        """Who waits for the request an answer names, as the tracker or the ledger tells."""
        tracked = self._tracker.get(request_id)
        if tracked is None:
            # Not tracked (a restart since): the ledger holds how it ended, if it did.
            me = str(self.config.id)
            rows = await self._ledger.find(request_id)
            to_command = _sent_command_in(rows, me)
            ends = [
                row["action"]
                for row in rows
                if row["source"] == me and row["action"] in SENDER_ENDS
            ]
            if ends:
                return AnswerFacts(waiter=Waiter.ENDED, ended_as=ends[-1], to_command=to_command)
            return AnswerFacts(waiter=Waiter.NOBODY, to_command=to_command)
        to_command = tracked.message.type == MSG_COMMAND_REQUEST
        if tracked.final and tracked.reply is None and tracked.state is not COMPLETED:
            return AnswerFacts(
                waiter=Waiter.ENDED, ended_as=str(tracked.state), to_command=to_command
            )
        if self.runner.requests.relaying(request_id) is not None:
            refused = reply.type == MSG_COMMAND_ERROR and (
                reply.details.get("code") == ErrorCode.LEDGER_UNAVAILABLE
            )
            return AnswerFacts(
                waiter=Waiter.RELAY, refused_unrecorded=refused, to_command=to_command
            )
        if tracked.expects_reply and not tracked.final:
            return AnswerFacts(waiter=Waiter.CALLER, to_command=to_command)
        return AnswerFacts(waiter=Waiter.NOBODY, to_command=to_command)


def _sent_command_in(rows: list[dict[str, Any]], me: str) -> bool:
    """Tell whether ledger rows about an id hold this agent's "sent" row of a command_request."""
    return any(
        row["action"] == LedgerAction.SENT
        and row["source"] == me
        and row["message_type"] == MSG_COMMAND_REQUEST
        for row in rows
    )


def answered(held_until: float | None, now: float) -> Answered:
    """What a duplicate command's answer is here, by until when it is held for replay."""
    if held_until is None:
        return Answered.NOT_YET
    return Answered.HELD if now <= held_until else Answered.GONE
