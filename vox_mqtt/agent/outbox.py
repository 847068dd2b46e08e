"""The outbox: send, request and reply; match acks and replies to what was sent.

What it sends is recorded, tracked, then handed to its deliveries (agent/deliveries.py),
which re-send it until acknowledged; acks and answers to commands go once (acksender.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from vox_mqtt.agent.acksender import AckSender
from vox_mqtt.agent.childbudget import ChildBudgets
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.deliveries import Deliveries
from vox_mqtt.agent.outgoing import Outgoing
from vox_mqtt.agent.ports import Publisher, Recorder, Settings
from vox_mqtt.agent.sendrules import (
    awaits_answer,
    check_size,
    deadline_passed,
    held_for_replay_until,
)
from vox_mqtt.agent.tracking import RequestTracker, SentState, TrackedRequest
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import (
    CommandFailed,
    InvalidMessage,
    VoxError,
)
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST, CancelRequest
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandError,
    CommandRequest,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
    new_message,
    parse,
    serialize,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.publishprops import PublishProperties

__all__ = ["Outbox", "Outgoing"]

log = logging.getLogger("vox_mqtt.agent")
_ANSWERS = frozenset({MSG_COMMAND_RESULT, MSG_COMMAND_ERROR})


class Outbox:
    """Every message this agent sends but an ack is recorded, tracked and re-sent."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: Recorder,
        publisher: Publisher,
        tracker: RequestTracker,
        metrics: AgentMetrics,
        tasks: TaskSet,
        props: PublishProperties,
        budgets: ChildBudgets | None = None,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._publisher = publisher
        self._tracker = tracker
        self._metrics = metrics
        self._tasks = tasks
        # Acks: published at once, never tracked or re-sent (agent/acksender.py).
        self.acks = AckSender(
            settings=settings,
            publisher=publisher,
            props=props,
            metrics=metrics,
            tasks=tasks,
            ledger=ledger,
        )
        # Sent, not yet acknowledged: re-sent on a timer, each delivery on its record.
        self.deliveries = Deliveries(
            settings=settings,
            ledger=ledger,
            publisher=publisher,
            tracker=tracker,
            metrics=metrics,
            tasks=tasks,
            props=props,
            budgets=budgets,
        )

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now: a reload may change its children."""
        return self._settings()

    # --- sending --------------------------------------------------------------------------

    async def send_message(
        self,
        message: VOXMessage,
        *,
        expects_reply: bool,
        then: Iterable[tuple[VOXMessage, LedgerAction, str | None]] = (),
        answering: VOXMessage | None = None,
    ) -> TrackedRequest:
        """Record, publish and keep re-sending a message until it is acknowledged.

        `then` rows (message, action, outcome) commit in the same transaction as its "sent" row.
        An answer to a received command_request (`answering`) is held for replay instead.
        """
        outgoing = self.prepare(message, expects_reply=expects_reply, answering=answering)
        # Kept until acknowledged: a crash before then re-sends it on restart.
        await self._ledger.record_message(
            message,
            LedgerAction.SENT,
            outbox=outgoing.outbox,
            replay_until=outgoing.replay_until,
            then=then,
        )
        return self.dispatch(outgoing)

    def prepare(
        self,
        message: VOXMessage,
        *,
        expects_reply: bool = False,
        answering: VOXMessage | None = None,
    ) -> Outgoing:
        """Check and serialize a message to send; its "sent" row and outbox entry are the caller's.

        Nothing is tracked or published yet: once they are durable, dispatch() it. An answer
        to a received command_request (`answering`) is never acknowledged: it is published
        once and held for replay until the request's deadline (docs/messages.md).
        """
        if message.target not in self.config.peers:
            raise VoxError(
                f"{self.config.name} may only talk to its master and children, not {message.target}"
            )
        payload = serialize(message)
        check_size(message, payload, self.config.max_message_bytes)
        topic = topics.inbox(message.target, self.config.id)
        until = None
        if answering is not None and awaits_answer(answering) and message.type in _ANSWERS:
            until = held_for_replay_until(answering, self.config.request_timeout)
        reply = expects_reply
        return Outgoing(
            message=message, expects_reply=reply, topic=topic, payload=payload, replay_until=until
        )

    def dispatch(self, outgoing: Outgoing) -> TrackedRequest:
        """Track and publish a prepared message whose "sent" row is durable, until acknowledged.

        An answer held for replay is published once: its requester re-sends if it lacks it.
        """
        tracked = self._tracker.track(outgoing.message, expects_reply=outgoing.expects_reply)
        if outgoing.replay_until is not None:
            self._tracker.published_once(tracked.message_id)
            self.acks.once(outgoing.message, outgoing.payload)
            return tracked
        self.deliveries.start(tracked, outgoing.payload, resend=False)
        return tracked

    def redeliver(self, unsent: Iterable[tuple[str, str, bytes]]) -> None:
        """Re-send what the outbox held at the last stop; nobody awaits these any more.

        A request whose deadline passed meanwhile is not re-sent: it ends expired.
        """
        for _, _, payload in unsent:
            try:
                message = parse(payload)
            except InvalidMessage:
                continue
            # A downstream request adopted after the restart is tracked already, its answer
            # awaited (CommandRunner.adopt); anything else nobody awaits now.
            # A command_request is re-sent until answered, as before the stop (awaits_answer).
            tracked = self._tracker.get(message.message_id) or self._tracker.track(
                message, expects_reply=awaits_answer(message)
            )
            if deadline_passed(message):
                reason = "its deadline passed while this agent was stopped"
                ending = self.deliveries.end(tracked, SentState.EXPIRED, ErrorCode.TIMEOUT, reason)
                self._tasks.spawn(ending, "expire")
            elif (too_old := self.deliveries.outlived(tracked)) is not None:
                failed = SentState.FAILED
                ending = self.deliveries.end(tracked, failed, ErrorCode.DELIVERY_FAILED, too_old)
                self._tasks.spawn(ending, "outlived")
            else:
                self.deliveries.start(tracked, payload, resend=True)

    async def publish_unrecorded(self, message: VOXMessage) -> None:
        """Publish once, unrecorded: an answer when the ledger cannot take it beats silence."""
        payload = serialize(message)
        try:
            check_size(message, payload, self.config.max_message_bytes)
            await self._publisher.publish(topics.inbox(message.target, self.config.id), payload)
        except VoxError as exc:
            log.warning("%s: %s not sent: %s", self.config.name, message.type, exc)

    async def send_error_to(self, peer: UUID, reply_to: UUID, code: str, reason: str) -> None:
        """Answer a refused message with command_error, once (publish_once)."""
        message = self.addressed(
            MSG_COMMAND_ERROR, CommandError(code=code, error=reason[:1000]), peer, reply_to
        )
        with contextlib.suppress(VoxError):
            await self.acks.record_once(message)

    async def await_reply(
        self,
        message: VOXMessage,
        timeout: float | None,
        *,
        then: Iterable[tuple[VOXMessage, LedgerAction, str | None]] = (),
    ) -> VOXMessage:
        """Send a message and return its reply; raise CommandFailed on an error or timeout."""
        started = time.perf_counter()
        tracked = await self.send_message(message, expects_reply=True, then=then)
        return await self.reply_to(tracked, timeout, started=started)

    async def reply_to(
        self, tracked: TrackedRequest, timeout: float | None, *, started: float
    ) -> VOXMessage:
        """Return the reply to a sent request; raise CommandFailed on an error or timeout."""
        message = tracked.message
        limit = self.config.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await tracked.done.wait()
        except TimeoutError:
            reason = f"no answer within {limit:.1f}s"
            await self.deliveries.end(tracked, SentState.EXPIRED, ErrorCode.TIMEOUT, reason)
            if message.type == MSG_COMMAND_REQUEST and tracked.acknowledged.is_set():
                # Given up on: the child holds it, and is told so that no level works on
                # past it (a cancel with reason "deadline", durable like any, docs/messages.md).
                # One never acknowledged left the outbox with its end: its deadline alone
                # keeps a late copy from starting.
                self._tasks.spawn(self._cancel_given_up(message), "cancel-deadline")
        # Given up by its delivery: the waiter learns once that end is durable.
        await self.deliveries.recorded(tracked)
        if message.type == MSG_COMMAND_REQUEST:
            # End to end as the requester sees it, answered or not.
            self._metrics.command_roundtrip_seconds.time_since(started)
        if tracked.state is SentState.COMPLETED and tracked.reply is not None:
            return tracked.reply
        raise CommandFailed(tracked.error_code or ErrorCode.TIMEOUT, tracked.error or "failed")

    async def _cancel_given_up(self, request: VOXMessage) -> None:
        with contextlib.suppress(VoxError):
            await self.send_cancel(request.target, request.message_id, "deadline")

    async def send_cancel(
        self, child: UUID, request_id: UUID, reason: str | None, *, expects_reply: bool = False
    ) -> TrackedRequest:
        """Send a child a cancel_request for a request sent to it (durable, counted)."""
        self._metrics.cancels_sent += 1
        cancel = self.addressed(
            MSG_CANCEL_REQUEST, CancelRequest(request_id=request_id, reason=reason), child
        )
        return await self.send_message(cancel, expects_reply=expects_reply)

    # --- what comes back: the one place acks and replies are matched ----------------------

    def settle_ack(self, ack: VOXMessage) -> None:
        """Mark the message an acknowledgement answers as received by its peer."""
        acknowledged = ack.payload_as(MessageAcknowledged).in_response_to
        tracked = self._tracker.acknowledged(acknowledged, by=ack.source)
        if tracked is not None and tracked.message.target != ack.source:
            return  # not from the agent it was sent to: re-sent on (docs/security.md, F24)
        if tracked is not None and awaits_answer(tracked.message) and not tracked.final:
            self.deliveries.patient(tracked)
            return
        if tracked is not None:
            self.deliveries.stop(tracked)  # its peer holds it: no more re-sending

    def settle_reply(self, reply: VOXMessage) -> None:
        """Complete (or fail, for command_error) the request a reply answers."""
        assert reply.reply_to is not None
        tracked = self._tracker.get(reply.reply_to)
        if tracked is not None and tracked.message.target != reply.source:
            return  # not from the agent it was sent to (docs/security.md, F24)
        if reply.type == MSG_COMMAND_ERROR:
            error = reply.payload_as(CommandError)
            self._tracker.failed(reply.reply_to, error.code, error.error, reply)
        else:
            self._tracker.completed(reply.reply_to, reply)
        if tracked is not None:
            self.deliveries.stop(tracked)  # answered: no more re-sending

    # --- the API roles and consoles use ---------------------------------------------------

    async def request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage:
        """Send a command_request to a child and return its command_result (CommandFailed).

        The request carries its deadline (now + timeout): its receiver, and every level below
        it, honour the deadline the requester gives up at (docs/messages.md).
        """
        limit = self.config.request_timeout if timeout is None else timeout
        deadline = datetime.now(UTC) + timedelta(seconds=limit)
        message = self.addressed(
            MSG_COMMAND_REQUEST,
            CommandRequest(
                command=command,
                params=params or {},
                deadline=deadline.isoformat(timespec="milliseconds"),
            ),
            to,
        )
        return await self.await_reply(message, limit)

    async def ask(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        timeout: float | None = None,
        reply_to: UUID | None = None,
    ) -> VOXMessage:
        """Send a message that expects an answer linked by reply_to, and return the answer."""
        return await self.await_reply(self.addressed(type, details, to, reply_to), timeout)

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
        message = self.addressed(type, details, to, reply_to, message_source=message_source)
        return await self.send_message(message, expects_reply=False)

    def addressed(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        to: UUID,
        reply_to: UUID | None = None,
        *,
        message_source: str | None = None,
    ) -> VOXMessage:
        """Return a new message from this agent to a peer (the one place one is built)."""
        return new_message(
            type,
            source=self.config.id,
            target=to,
            details=details,
            reply_to=reply_to,
            message_source=message_source or self.config.message_source,
        )

    async def notify_master(
        self, type: str, details: dict[str, Any] | BaseModel, *, message_source: str | None = None
    ) -> TrackedRequest:
        """Send an event up to this agent's master."""
        if self.config.master_id is None:
            raise VoxError(f"{self.config.name} has no master")
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
