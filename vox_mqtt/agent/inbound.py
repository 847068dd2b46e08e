"""The inbound pipeline: parse -> verify -> record/dedupe -> ack -> route, per message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.outbox import Outbox, Outgoing
from vox_mqtt.agent.prepared import QuickAnswer
from vox_mqtt.agent.roles import Handler
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import verify
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.agent.tracking import RequestState
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import InvalidMessage, LedgerError, TopicError
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandError,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
    parse,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.sitelinks import parse_link_topic
from vox_mqtt.transport.session import Inbound

__all__ = ["InboundPipeline", "Listener", "Observed"]

log = logging.getLogger("vox_mqtt.agent")
COMPLETED = RequestState.COMPLETED
SENDER_ENDS = frozenset({"expired", "failed"})  # how a request this agent sent can end
_ANSWERS = frozenset({MSG_COMMAND_RESULT, MSG_COMMAND_ERROR})
# How long an idempotent command may take for its answer to commit with its record and stand
# for its acknowledgement (docs/messages.md, acknowledgements). A slower one is acknowledged
# as usual once its record commits; the wait delays nothing else.
QUICK_ANSWER_WINDOW = 0.005
RETAINED_HELP = "publish an empty retained message on the topic, docs/broker.md"

Listener = Callable[[VOXMessage], Awaitable[None] | None]
Observed = Callable[[Inbound, topics.StatusTopic | topics.WarroomTopic], Awaitable[None]]


class InboundPipeline:
    """Take every message the session delivers; a peer's message is durable before its ack."""

    def __init__(
        self,
        ctx: AgentContext,
        *,
        outbox: Outbox,
        runner: CommandRunner,
        router: Router,
        observed: Observed,
        linked: Callable[[Inbound], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.outbox = outbox
        self.runner = runner
        self.router = router
        self.observed = observed  # status and war-room messages go to liveness
        self.linked = linked  # bridge link states, in a federated fleet (sitelinks.py)
        self.listeners: list[Listener] = []  # see every verified inbound message
        self._intake_slots = asyncio.Semaphore(ctx.config.max_intake)
        self._in_progress: dict[UUID, asyncio.Event] = {}
        self.intake = 0  # inbound messages being recorded, acknowledged and routed
        self._taken_in = asyncio.Event()  # set while no message is in intake
        self._taken_in.set()
        ctx.metrics.gauge("intake_queue", self._waiting)

    def _waiting(self) -> int:
        """Return the messages received and not yet routed: queued in the session or in intake."""
        session = self.ctx.session
        return self.intake + (0 if session is None else session.queued)

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self.ctx.config

    async def run(self) -> None:
        """Read the session's messages until it ends."""
        async for inbound in self.ctx.live_session().messages():
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
                await self._intake_slots.acquire()
                self.ctx.tasks.spawn(self._intake(inbound, topic), "intake")

    async def _intake(self, inbound: Inbound, topic: topics.InboxTopic) -> None:
        self.intake += 1
        self._taken_in.clear()
        try:
            await self._process(inbound, topic)
        except Exception:
            # Nothing a peer sends may stop the agent: log it and go on.
            log.exception("%s: failed to process a message on %s", self.config.name, inbound.topic)
        finally:
            self.intake -= 1
            if self.intake == 0:
                self._taken_in.set()
            self._intake_slots.release()

    async def drain(self, timeout: float) -> None:
        """Wait (up to timeout) for the messages already taken in to be recorded and acked.

        A caller may hold its answer before the answer's commit (docs/ledger.md); its ack
        follows the commit, and the agent must not leave before it is at least queued.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._taken_in.wait()

    async def _process(self, inbound: Inbound, topic: topics.InboxTopic) -> None:
        ledger = self.ctx.ledger
        try:
            message = parse(inbound.payload, max_bytes=self.config.max_message_bytes)
        except InvalidMessage as exc:
            await self._reject_unparsable(inbound, topic, exc)
            return
        problem = verify(
            message,
            topic,
            me=self.config.id,
            master_id=self.config.master_id,
            peers=self.config.peers,
        )
        if problem is not None:
            await self._reject(message, inbound, topic, problem)
            return
        if inbound.retain:
            await self._reject_retained(message, inbound)
            return
        if ledger.write_failure is not None:
            await self._refuse_unrecordable(message, ledger.write_failure)
            return
        message_id = message.message_id
        # QoS 1 and our own re-sends deliver duplicates: re-ack, never re-execute. The
        # in-progress map is checked and filled with no await between, so two copies
        # arriving together cannot both pass the ledger check; a copy of a message still
        # being recorded waits for that record, so no ack ever precedes durability.
        ack = None
        implied = False  # an answer committed with the record stands for the ack
        if message.type != MSG_ACKNOWLEDGED:
            ack = message.acknowledgement(message_source=self.config.message_source)
        # One commit per inbound message: its "received" row, the "sent" row of its ack, and
        # for a command that starts at once its "started" row; an ack takes its message out
        # of the outbox in the same transaction. docs/ledger.md says what a restart proves.
        then: list[tuple[VOXMessage, str, str | None]] = [(ack, "sent", None)] if ack else []
        recording = self._in_progress.get(message_id)
        if recording is not None:
            await recording.wait()
            if not await ledger.has_message(message_id, emitted_at=message.emitted_at):
                return  # the first copy failed to record; the sender will re-send
            duplicate = True
        else:
            recording = self._in_progress[message_id] = asyncio.Event()
            try:
                duplicate = await ledger.has_message(message_id, emitted_at=message.emitted_at)
                if not duplicate and ack is None:
                    # An ack: nothing waits for its row, so it stops the re-sending at once
                    # and its row (with the outbox removal) joins the next commit.
                    done = message.payload_as(MessageAcknowledged).in_response_to
                    row = ledger.record_received_later(
                        message, topic=inbound.topic, outbox_done=done
                    )
                    self.outbox.settle_ack(message)
                    self.ctx.metrics.messages_in.inc(message.type)
                    await row
                    return
                if not duplicate:
                    implied = await self._record_received(message, inbound.topic, then)
            except LedgerError as exc:
                await self._refuse_unrecordable(message, str(exc))
                return
            finally:
                del self._in_progress[message_id]
                recording.set()
        if duplicate:
            self.ctx.metrics.duplicates += 1
            await ledger.record_message(message, "duplicate", topic=inbound.topic, then=then)
            if ack is not None:
                await self.outbox.publish_ack(message, ack)
            return
        self.ctx.metrics.messages_in.inc(message.type)
        if ack is not None and not implied:
            # The record is durable, so the ack may go; routing need not wait for its PUBACK.
            self.outbox.ack_soon(message, ack)
        await self._route(message)

    async def _record_received(
        self, message: VOXMessage, topic: str, then: list[tuple[VOXMessage, str, str | None]]
    ) -> bool:
        """Commit a new message's rows; True when its answer stands for its acknowledgement."""
        runner = self.runner
        starting = await runner.starts_at_once(message)
        delegation = None if starting else runner.delegates_at_once(message)
        answer = runner.answers_at_once(message)
        kept: Outgoing | None = None
        implied = False
        # A reply proves its request arrived: the request leaves the outbox with this commit
        # even when no acknowledgement of it came (an answer that stands for one).
        answered = message.reply_to if message.type in _ANSWERS else None
        if starting:
            then = [*then, (message, "started", None)]
            quick = await self._quick_answer(message)
            if quick is not None:
                # Idempotent and answered within the window: one commit holds its record,
                # its start, its answer (whole in the outbox) and its end; the answer, sent
                # once that commit is durable, is its acknowledgement (docs/messages.md).
                kept, implied = quick.outgoing, True
                then = [
                    (message, "started", None),
                    (kept.tracked.message, "sent", None),
                    (message, quick.end, None),
                ]
        elif delegation is not None:
            # Its downstream request and "delegated" row commit here too: one commit on the
            # way down instead of two (docs/ledger.md).
            kept = delegation.outgoing
            then = [
                *then,
                (kept.tracked.message, "sent", None),
                (message, "delegated", str(delegation.child)),
            ]
        elif answer is not None:
            # A child's answer: this agent's answer upstream commits with it, one commit on
            # the way up instead of two (docs/ledger.md).
            kept = answer.outgoing
            then = [*then, (kept.tracked.message, "sent", None), (answer.request, answer.end, None)]
        elif self._settles_a_waiter(message):
            # The caller sees its answer now, beside the commit of its "received" row; the
            # ack waits for that commit, so the answerer re-sends until the answer is durable
            # here (docs/ledger.md, rows that commit together). The ledger keeps the order:
            # whatever the caller records next commits after this row.
            recording = asyncio.ensure_future(
                self.ctx.ledger.record_message(
                    message, "received", topic=topic, then=then, outbox_done=answered
                )
            )
            self.outbox.settle_reply(message)
            await recording
            return False
        try:
            await self.ctx.ledger.record_message(
                message,
                "received",
                topic=topic,
                then=then,
                outbox=None if kept is None else (kept.topic, kept.payload),
                outbox_for=None if kept is None else kept.tracked.message,
                outbox_done=answered,
            )
        except BaseException:
            if starting:
                runner.cancel_start(message)
            if delegation is not None:
                runner.cancel_delegation(message)
            if answer is not None:
                runner.answer_recorded(answer, False)
            raise
        if answer is not None:
            runner.answer_recorded(answer, True)
        return implied

    async def _quick_answer(self, message: VOXMessage) -> QuickAnswer | None:
        """Run an idempotent command now; its answer if it comes within QUICK_ANSWER_WINDOW."""
        running = self.runner.runs_at_once(message)
        if running is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(running), QUICK_ANSWER_WINDOW)
        if not running.done() or running.cancelled() or running.exception() is not None:
            return None  # slower: its record commits now, and its answer later, as usual
        return self.runner.quick_answer(message, running.result())

    def _settles_a_waiter(self, message: VOXMessage) -> bool:
        """Tell whether a message answers a live request of this agent that a caller awaits."""
        if message.reply_to is None or message.type in (MSG_ACKNOWLEDGED, MSG_COMMAND_REQUEST):
            return False
        tracked = self.ctx.tracker.get(message.reply_to)
        return tracked is not None and tracked.expects_reply and not tracked.final

    async def _refuse_unrecordable(self, message: VOXMessage, failure: str) -> None:
        """Accept nothing that cannot be recorded: no ack, and a command gets a clear error."""
        log.warning(
            "%s: refused %s %s: cannot record it: %s",
            self.config.name,
            message.type,
            message.message_id,
            failure,
        )
        if message.type == MSG_ACKNOWLEDGED:
            self.outbox.settle_ack(message)  # our own message arrived: stop re-sending it
        elif message.type == MSG_COMMAND_REQUEST:
            error = CommandError(
                code=ErrorCode.LEDGER_UNAVAILABLE,
                error=f"{self.config.name} cannot record, so it accepts no work: {failure}"[:1000],
                command=str(message.details.get("command", "")) or None,
            )
            await self.outbox.publish_unrecorded(message.reply(MSG_COMMAND_ERROR, error))
        # Anything else is not acknowledged: its sender re-sends it (up to its timeout).

    async def _reject(
        self, message: VOXMessage, inbound: Inbound, topic: topics.InboxTopic, problem: str
    ) -> None:
        self.ctx.metrics.rejected.inc(ErrorCode.UNAUTHORIZED_SOURCE)
        log.warning(
            "%s: rejected %s from %s: %s", self.config.name, message.type, topic.source, problem
        )
        await self.ctx.ledger.record_message(
            message,
            "rejected",
            outcome=ErrorCode.UNAUTHORIZED_SOURCE,
            reason=problem,
            topic=inbound.topic,
        )
        if topic.source in self.config.peers and message.type != MSG_ACKNOWLEDGED:
            await self.outbox.send_error_to(
                topic.source, message.message_id, ErrorCode.UNAUTHORIZED_SOURCE, problem
            )

    async def _reject_retained(self, message: VOXMessage, inbound: Inbound) -> None:
        # The broker re-delivers a retained message on every new subscription: it is
        # recorded each time and never executed, acked or answered (docs/broker.md).
        reason = f"retained message in an inbox: never executed ({RETAINED_HELP})"
        log.warning(
            "%s: rejected %s on %s: %s", self.config.name, message.type, inbound.topic, reason
        )
        await self.ctx.ledger.record_message(
            message,
            "rejected",
            outcome=ErrorCode.INVALID_MESSAGE,
            reason=reason,
            topic=inbound.topic,
        )

    async def _reject_unparsable(
        self, inbound: Inbound, topic: topics.InboxTopic, exc: InvalidMessage
    ) -> None:
        self.ctx.metrics.rejected.inc(ErrorCode.INVALID_MESSAGE)
        log.warning(
            "%s: rejected a message from %s: %s", self.config.name, topic.source, exc.reason
        )
        await self.ctx.ledger.record_rejected(
            inbound.payload,
            exc.reason,
            topic=inbound.topic,
            source=topic.source,
            message_id=exc.message_id,
        )
        # The sender is known from the topic (the broker lets it write only there).
        if topic.source in self.config.peers and exc.message_id is not None:
            await self.outbox.send_error_to(
                topic.source, exc.message_id, ErrorCode.INVALID_MESSAGE, exc.reason
            )

    async def _route(self, message: VOXMessage) -> None:
        if message.type == MSG_ACKNOWLEDGED:
            self.outbox.settle_ack(message)
            return
        for listener in self.listeners:
            outcome = listener(message)
            if outcome is not None:
                await outcome
        if message.type == MSG_COMMAND_REQUEST:
            self.runner.begin(message)
            return
        if message.reply_to is not None:
            if await self._record_if_late(message):
                return
            self.outbox.settle_reply(message)
        for handler in self.router.event_handlers(message.type):
            self.ctx.tasks.spawn(self._run_event(handler, message), f"event-{message.type}")

    async def _record_if_late(self, reply: VOXMessage) -> bool:
        """Record an answer to a request that already ended here (expired, failed) as late.

        Such an answer is recorded and acknowledged, never reported as the request's outcome
        nor handed to a role (docs/ledger.md, terminal states).
        """
        assert reply.reply_to is not None
        tracked = self.ctx.tracker.get(reply.reply_to)
        if tracked is not None:
            ended = tracked.final and tracked.reply is None and tracked.state is not COMPLETED
            end = str(tracked.state)
        else:
            # Not tracked (a restart since): the ledger holds how it ended, if it did.
            me = str(self.config.id)
            ends = [
                row["action"]
                for row in await self.ctx.ledger.find(reply.reply_to)
                if row["source"] == me and row["action"] in SENDER_ENDS
            ]
            ended, end = bool(ends), (ends[-1] if ends else "")
        if not ended:
            return False
        log.info(
            "%s: a late %s to %s, which %s here", self.config.name, reply.type, reply.reply_to, end
        )
        await self.ctx.ledger.record_message(
            reply, "late", outcome=end, reason=f"answers {reply.reply_to}, which ended {end} here"
        )
        return True

    async def _run_event(self, handler: Handler, message: VOXMessage) -> Any:
        try:
            await handler(message)
        except Exception:
            log.exception("%s: %s handler failed", self.config.name, message.type)
