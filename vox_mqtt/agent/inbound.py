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
from vox_mqtt.agent.childbudget import CAUSE, FLOODING, ChildBudgets
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.lifecycle import LIFECYCLE_STEPS, Lifecycle
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import (
    ANSWERS,
    Admission,
    Answered,
    AnswerFacts,
    CommandFacts,
    Facts,
    Local,
    Plan,
    Step,
    Waiter,
    admit,
    decide,
)
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.prepared import Row, Staged
from vox_mqtt.agent.refusals import Refusals
from vox_mqtt.agent.roles import Handler, is_idempotent
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.agent.sendrules import awaits_answer, deadline_passed
from vox_mqtt.agent.tracking import RequestState, RequestTracker
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
    MessageAcknowledged,
    VOXMessage,
    parse,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.sitelinks import parse_link_topic
from vox_mqtt.transport.session import Inbound, Session

__all__ = ["InboundPipeline", "Listener", "Observed"]

log = logging.getLogger("vox_mqtt.agent")
COMPLETED = RequestState.COMPLETED
SENDER_ENDS = frozenset(
    {LedgerAction.EXPIRED, LedgerAction.FAILED}
)  # how a request this agent sent can end
# Their plan needs no answer facts (a progress names its request in reply_to, as answers do).
_LIFECYCLE_TYPES = frozenset({MSG_COMMAND_PROGRESS, MSG_STATUS_QUERY})

# A copy of a message recorded already: recorded `duplicate`, never acted on again.
_COPIES = frozenset({Step.DUPLICATE, Step.REPLAY})

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
        self._budgets = budgets  # each child's event rate and backlog (docs/security.md, F25)
        self.flooding = flooding  # told of a child over its limits (a war-room incident)
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
        ledger = self._ledger
        if inbound.forgery is not None:  # the session's verdict, before parse (docs/security.md)
            await self._refusals.forged(inbound, topic, inbound.forgery)
            return
        try:
            message = parse(inbound.payload, max_bytes=self.config.max_message_bytes)
        except InvalidMessage as exc:
            await self._refusals.unparsable(inbound, topic, exc)
            return
        if await self._refusals.stale(inbound, message):
            return
        config = self.config
        admission = Admission(
            me=config.id,
            master_id=config.master_id,
            peers=config.peers,
            retained=inbound.retain,
            write_failure=ledger.write_failure,
        )
        refusal = admit(message, topic, admission)
        if refusal is not None:
            await self._refusals.refuse(message, inbound, topic, refusal)
            return
        # Only the agent a request went to may answer, acknowledge or report on it (F24).
        if await self._answers.refused(message, inbound.topic, inbound.payload):
            return
        self.outbox.heard_from(message.source)  # it is there: what was held for it goes (F25)
        message_id = message.message_id
        # QoS 1 and our own re-sends deliver duplicates: re-ack, never re-execute. The
        # in-progress map is checked and filled with no await between, so two copies
        # arriving together cannot both pass the ledger check; a copy of a message still
        # being recorded waits for that record, so no ack ever precedes durability.
        recording = self._in_progress.get(message_id)
        plan: Plan
        staged = Staged()
        cause: UUID | None = None  # the child whose event this is, counted in its backlog
        held: bytes | None = None  # a duplicate command's answer, held for replay
        if recording is not None:
            await recording.wait()
            if not await ledger.has_message(message_id, emitted_at=message.emitted_at):
                return  # the first copy failed to record; the sender will re-send
            facts, held = await self._duplicate_facts(message)
            plan = decide(message, facts)
        else:
            recording = self._in_progress[message_id] = asyncio.Event()
            try:
                handler = None
                if await ledger.has_message(message_id, emitted_at=message.emitted_at):
                    facts, held = await self._duplicate_facts(message)
                else:
                    facts, handler = await self._facts(message)
                plan = decide(message, facts)  # the one decision about this message
                if self._refusals.unknown_beyond_budget(plan, topic):
                    await self._refusals.answer_unrecorded(message)
                    return
                if plan.step is Step.EVENT and message.source in config.children:
                    if self._over_budget(message.source):
                        return  # unacknowledged: its sender keeps it and re-sends it later
                    cause = message.source
                if plan.step is Step.SETTLE_ACK:
                    # Nothing waits for an ack's row: it stops the re-sending at once and its
                    # row (with the outbox removal) joins the next commit.
                    done = message.payload_as(MessageAcknowledged).in_response_to
                    if self._refusals.unrecorded_ack(done):
                        return  # the ack of an unrecorded report: unrecorded too
                    row = ledger.record_received_later(
                        message, topic=inbound.topic, outbox_done=self._leaves_outbox(done)
                    )
                    self.outbox.settle_ack(message)
                    self._metrics.messages_in.inc(message.type)
                    await row
                    return
                if plan.step not in _COPIES:
                    ack, then = self._ack_rows(message, plan)
                    staged = await self._commit(message, inbound.topic, then, plan, handler)
            except LedgerError as exc:
                self._done_with(cause)
                await self._refusals.unrecordable(message, str(exc))
                return
            except BaseException:
                self._done_with(cause)
                raise
            finally:
                del self._in_progress[message_id]
                recording.set()
        if plan.step in _COPIES:
            ack, then = self._ack_rows(message, plan)
            self._metrics.duplicates += 1
            await ledger.record_message(
                message, LedgerAction.DUPLICATE, topic=inbound.topic, then=then
            )
            if plan.step is Step.REPLAY and held is not None:
                # Its requester lacks the answer: the one recorded goes again, same id, and
                # nothing runs (docs/messages.md, "Answers need no acknowledgement"); a
                # CANCELED one once its cut handler ended (agent/lifecycle.py).
                if not self.lifecycle.cut_running(message.message_id):
                    self.outbox.acks.replay(held)
            elif ack is not None:
                await self.outbox.acks.publish(message, ack)
            return
        self._metrics.messages_in.inc(message.type)
        if ack is not None and not staged.implied:
            # The record is durable, so the ack may go; routing need not wait for its PUBACK.
            self.outbox.acks.soon(message, ack)
        try:
            await self._hand_on(message, plan, staged)
        finally:
            self._done_with(cause)

    def _over_budget(self, child: UUID) -> bool:
        """Tell whether a child's event is over its rate or backlog: refused, counted, posted.

        Within them, it counts in the child's backlog until handled (docs/security.md, F25).
        """
        if self._budgets is None:
            return False
        config = self.config
        problem, report = self._budgets.admit(
            child, now=time.monotonic(), rate=config.child_rate, backlog=config.child_backlog
        )
        if problem is None:
            self._budgets.started(child)
            return False
        self._metrics.rejected.inc(FLOODING)
        if report:
            name = config.children.get(child, str(child))
            log.warning("%s: refusing events of %s for now: %s", config.name, name, problem)
            if self.flooding is not None:
                self.flooding(child, problem)
        return True

    def _done_with(self, cause: UUID | None) -> None:
        if cause is not None and self._budgets is not None:
            self._budgets.finished(cause)

    def _ack_rows(self, message: VOXMessage, plan: Plan) -> tuple[VOXMessage | None, list[Row]]:
        """The ack the plan owes a message, and its "sent" row for the message's commit.

        One commit per inbound message: its "received" row, the "sent" row of its ack, and
        the rows its plan adds; docs/ledger.md says what a restart proves of each group.
        """
        if not plan.acknowledge:
            return None, []
        ack = acknowledge(message, message_source=self.config.message_source)
        return ack, [(ack, LedgerAction.SENT, None)]

    def _leaves_outbox(self, acknowledged: UUID) -> UUID | None:
        """Return the sent message an ack takes out of the outbox: None for a command_request.

        A command_request stays there until its answer is recorded (or it ends): a restart
        re-sends it until answered, as the answer is never acknowledged (docs/ledger.md).
        """
        tracked = self._tracker.get(acknowledged)
        if tracked is not None and awaits_answer(tracked.message):
            return None
        return acknowledged

    async def _duplicate_facts(self, message: VOXMessage) -> tuple[Facts, bytes | None]:
        """What deciding a copy of a recorded message reads; with a command's held answer."""
        if message.type == MSG_COMMAND_REQUEST:
            found = await self._ledger.held_answer(message.message_id)
            held, until = (None, None) if found is None else found
            return Facts(duplicate=True, answered=answered(until, time.time())), held
        if message.type in ANSWERS and message.reply_to is not None:
            to_command = await self._sent_command(message.reply_to)
            answer = AnswerFacts(waiter=Waiter.NOBODY, to_command=to_command)
            return Facts(duplicate=True, answer=answer), None
        return Facts(duplicate=True), None

    async def _sent_command(self, request_id: UUID) -> bool:
        """Tell whether this agent sent a command_request under this id (tracker, else ledger)."""
        tracked = self._tracker.get(request_id)
        if tracked is not None:
            return tracked.message.type == MSG_COMMAND_REQUEST
        return _sent_command_in(await self._ledger.find(request_id), str(self.config.id))

    async def _facts(self, message: VOXMessage) -> tuple[Facts, Handler | None]:
        """Gather what the plan of a message reads; the router is consulted here, once."""
        if message.type == MSG_COMMAND_REQUEST:
            return self._command_facts(message, slot_free=self.runner.slot_free)
        if message.type == MSG_CANCEL_REQUEST:
            named = message.payload_as(CancelRequest).request_id
            return Facts(target=await self.lifecycle.cancel_target(named)), None
        if message.type in _LIFECYCLE_TYPES or message.reply_to is None:
            return Facts(), None
        return Facts(answer=await self._answer_facts(message.reply_to, message)), None

    def _command_facts(
        self, message: VOXMessage, *, slot_free: bool
    ) -> tuple[Facts, Handler | None]:
        """What deciding a command reads: the router, consulted once, and the runner's state."""
        runner = self.runner
        name = message.payload_as(CommandRequest).command
        handler = self.router.command_handler(name)
        local = Local.NONE
        if handler is not None:
            local = Local.IDEMPOTENT if is_idempotent(handler) else Local.PLAIN
        command = CommandFacts(
            command=name,
            deadline_passed=deadline_passed(message),
            stopping=runner.stopping,
            slot_free=slot_free,
            local=local,
            children=runner.children() if handler is None else (),
            load=runner.load,
            canceled_before=self.lifecycle.canceled_before(message.message_id),
        )
        return Facts(command=command), handler

    def plan_resumed(self, message: VOXMessage) -> tuple[Plan, Handler | None]:
        """Plan a command read back from the ledger at a restart (CommandRunner.resume).

        Its record committed before the restart, so nothing starts with it: no slot is
        taken at once and nothing runs early.
        """
        facts, handler = self._command_facts(message, slot_free=False)
        return decide(message, facts), handler

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

    async def _commit(
        self,
        message: VOXMessage,
        topic: str,
        then: list[Row],
        plan: Plan,
        handler: Handler | None,
    ) -> Staged:
        """Commit a new message's rows with what its plan stages; return the staged plan.

        One commit, then one hand-off: the runner stages the plan's rows before it and
        executes the staged plan after it (_hand_on), or drops it when the commit fails.
        """
        # A reply proves its request arrived: the request leaves the outbox with this commit
        # even when no acknowledgement of it came (an answer that stands for one).
        answered = message.reply_to if message.type in ANSWERS else None
        if plan.step is Step.ANSWER:
            # The caller sees its answer now, beside the commit of its "received" row; the
            # ack waits for that commit, so the answerer re-sends until the answer is durable
            # here (docs/ledger.md, rows that commit together). The ledger keeps the order:
            # whatever the caller records next commits after this row.
            recording = asyncio.ensure_future(
                self._ledger.record_message(
                    message, LedgerAction.RECEIVED, topic=topic, then=then, outbox_done=answered
                )
            )
            self.outbox.settle_reply(message)
            await recording
            return Staged()
        lifecycle = plan.step in LIFECYCLE_STEPS
        if lifecycle:
            staged = await self.lifecycle.stage(message, plan)
        else:
            staged = await self.runner.stage(message, plan, handler)
        kept = staged.outgoing
        try:
            await self._ledger.record_message(
                message,
                LedgerAction.RECEIVED,
                topic=topic,
                # An answer that commits here stands for the ack: no ack row, no ack.
                then=[*([] if staged.implied else then), *staged.rows],
                outbox=None if kept is None else kept.outbox,
                outbox_for=None if kept is None else kept.message,
                outbox_done=answered,
                replay_until=None if kept is None else kept.replay_until,
            )
        except BaseException:
            if lifecycle:
                self.lifecycle.drop(message, plan, staged)
            else:
                self.runner.drop(staged)
            raise
        return staged

    async def _hand_on(self, message: VOXMessage, plan: Plan, staged: Staged) -> None:
        """Give a committed message to whoever carries out its plan."""
        if plan.step is Step.LATE:
            # Recorded and acknowledged; never the request's outcome nor a role's to handle.
            log.info("%s: a late %s: %s", self.config.name, message.type, plan.reason)
            await self._ledger.record_message(
                message, LedgerAction.LATE, outcome=plan.ended, reason=plan.reason
            )
            return
        for listener in self.listeners:
            outcome = listener(message)
            if outcome is not None:
                await outcome
        if plan.step in LIFECYCLE_STEPS:
            self.lifecycle.execute(message, plan, staged)
            return
        self.runner.execute(staged)
        if message.type == MSG_COMMAND_REQUEST:
            return
        if message.reply_to is not None:
            self.outbox.settle_reply(message)  # settled already for Step.ANSWER: a no-op
        child = message.source if message.source in self.config.children else None
        for event_handler in self.router.event_handlers(message.type):
            if child is not None and self._budgets is not None:
                self._budgets.started(child)  # in its backlog until the handler returns
            self._tasks.spawn(
                self._run_event(event_handler, message, child), f"event-{message.type}"
            )

    async def _run_event(self, handler: Handler, message: VOXMessage, child: UUID | None) -> Any:
        # What the handler sends counts in the child's backlog until acknowledged (outbox).
        CAUSE.set(child)
        try:
            await handler(message)
        except Exception:
            log.exception("%s: %s handler failed", self.config.name, message.type)
        finally:
            self._done_with(child)


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
