"""Deliveries: publish a sent message now, re-send it on a timer until its peer has it.

One delivery hangs on each record of a message being re-sent (`TrackedRequest.delivery`,
agent/tracking.py); the tracker attaches and takes it off, this module moves its timer. No
task per message: a re-send is a timer on the loop. A delivery ends when the peer
acknowledges or answers, or when it is given up at its time; a message given up ends
failed or expired, and its end is recorded before whoever waits for it is told
(docs/ledger.md, terminal states). Peers not heard from get fewer copies
(agent/quietpeers.py, docs/security.md F25).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from uuid import UUID

from vox_mqtt.agent.childbudget import CAUSE, ChildBudgets
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.ports import Publisher, Recorder, Settings
from vox_mqtt.agent.quietpeers import QuietPeers
from vox_mqtt.agent.sendrules import (
    delivered,
    expiry,
    outlived,
    request_time_left,
    resend_deadline,
)
from vox_mqtt.agent.tracking import Delivery, RequestTracker, SentState, TrackedRequest
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.messages import MSG_COMMAND_ERROR, MSG_COMMAND_RESULT, ErrorCode
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.outcome import PublishOutcome
from vox_mqtt.transport.publishprops import PublishProperties

__all__ = ["Deliveries"]

log = logging.getLogger("vox_mqtt.agent")
_ANSWERS = frozenset({MSG_COMMAND_RESULT, MSG_COMMAND_ERROR})


class Deliveries:
    """Publish each tracked message until acknowledged; give it up at its time, recorded."""

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
        self._props = props
        self._budgets = budgets  # what a child's events have in work here (F25)
        self._quiet = QuietPeers()  # peers not heard from: copies held back (quietpeers.py)
        self._closed = False

    @property
    def config(self) -> AgentConfig:
        return self._settings()

    def start(self, tracked: TrackedRequest, payload: bytes, *, resend: bool) -> None:
        """Publish a tracked message now (`resend`: again, after a restart) and keep at it."""
        self.stop(tracked)  # one delivery per record: a second start replaces the first
        message = tracked.message
        # Built once per (peer, type); only a deadline's shrinking expiry needs fresh ones.
        fixed = None if expiry(message) else self._props.inbox(message.target, message.type)
        # A request waits for its acknowledgement until its deadline, when it has one.
        patience = request_time_left(message, self.config.request_timeout)
        delivery = Delivery(
            payload=payload,
            props=fixed,
            give_up_at=time.monotonic() + patience,
            patience=patience,
            resend_until=resend_deadline(message, self.config.broker.signing),
            delay=self.config.resend_initial,
            answer=message.type in _ANSWERS and message.reply_to is not None,
            cause=CAUSE.get(),
            quiet=self._quiet.new(message.target),
        )
        if delivery.cause is not None and self._budgets is not None:
            self._budgets.started(delivery.cause)
        self._tracker.deliver(tracked, delivery)
        self._attempt(tracked, resend=resend)

    def _attempt(self, tracked: TrackedRequest, *, resend: bool = True) -> None:
        """Publish once more, unless acknowledged or given up; then wait for the next try."""
        delivery = tracked.delivery
        if delivery is None:
            return  # stopped since this try was set
        delivery.timer = None
        if (
            self._closed
            or tracked.final
            or delivered(tracked.message, acknowledged=tracked.acknowledged.is_set())
        ):
            self.stop(tracked)
            return
        metrics = self._metrics
        message = tracked.message
        if delivery.answer:
            # An answer is never given up while its requester is a peer: a requester that
            # was away gets it when it is back (docs/security.md, F25).
            if message.target not in self.config.peers:
                reason = "its requester is no longer this agent's master or child"
                self._give_up(tracked, SentState.FAILED, ErrorCode.DELIVERY_FAILED, reason)
                return
        elif time.monotonic() >= delivery.give_up_at:
            metrics.delivery_failures += 1
            reason = f"no acknowledgement within {delivery.patience:.0f}s"
            self._give_up(tracked, SentState.EXPIRED, ErrorCode.TIMEOUT, reason)
            return
        until = delivery.resend_until
        if until is not None and (too_old := self.outlived(tracked, until)) is not None:
            metrics.delivery_failures += 1
            self._give_up(tracked, SentState.FAILED, ErrorCode.DELIVERY_FAILED, too_old)
            return
        peer = message.target
        if self._quiet.holds(
            peer,
            tracked.message_id,
            delivery.quiet,
            answer=delivery.answer,
            resend=resend,
            limit=self.config.quiet_publishes,
        ):
            self._next_try(tracked, delivery)  # held: it still ends at its time
            return
        if resend:
            metrics.resends += 1
        elif not delivery.counted:
            metrics.messages_out.inc(message.type)
        delivery.counted = True
        self._quiet.published(peer, delivery.quiet, resend=resend)
        props = delivery.props
        if props is None:
            props = self._props.inbox(message.target, message.type, expiry=expiry(message))
        topic = topics.inbox(message.target, self.config.id)
        try:
            outcome = self._publisher.publish_soon(topic, delivery.payload, props=props)
        except VoxError as exc:
            log.info("%s: will re-send %s: %s", self.config.name, message.message_id, exc)
            outcome = None
        if outcome is not None:
            outcome.add_done_callback(functools.partial(self._published, tracked))
        # No connection up: the next try comes at the same pace; the session reconnects.
        self._next_try(tracked, delivery)

    def _next_try(self, tracked: TrackedRequest, delivery: Delivery) -> None:
        loop = asyncio.get_running_loop()
        delay = delivery.delay
        if (until := delivery.resend_until) is not None:
            delay = min(delay, max(0.0, until - time.time()))  # end it at the window, not later
        delivery.timer = loop.call_later(delay, self._attempt, tracked)
        delivery.delay = min(delivery.delay * 2, self.config.resend_max) * random.uniform(0.8, 1.2)

    def _try_now(self, tracked: TrackedRequest, *, afresh: bool) -> None:
        """Publish once more now; `afresh`: back to the first pace of re-sending."""
        delivery = tracked.delivery
        if delivery is None:
            return
        if delivery.timer is not None:
            delivery.timer.cancel()
        if afresh:
            delivery.delay = self.config.resend_initial
        self._attempt(tracked)

    def reconnected(self) -> None:
        """Try every unacknowledged message again now: a connection is back up.

        Each keeps its pace: an acknowledged request waiting for its answer stays at the
        slowest (`patient`).
        """
        for tracked in self._tracker.delivering():
            self._try_now(tracked, afresh=False)

    def heard_from(self, peer: UUID, *, back: bool = False) -> None:
        """What was held back for a peer goes now; back (ACTIVE again): all it is owed goes now."""
        held = [self._tracker.get(message_id) for message_id in self._quiet.heard(peer)]
        if back:  # an acknowledged request would wait resend_max after a restart (docs/messages.md)
            held += [t for t in self._tracker.delivering() if t.message.target == peer]
        for tracked in dict.fromkeys(filter(None, held)):
            self._try_now(tracked, afresh=True)

    def patient(self, tracked: TrackedRequest) -> None:
        """Re-send an acknowledged request at the slowest pace, only lest its answer be lost."""
        delivery = tracked.delivery
        if delivery is None or delivery.delay >= self.config.resend_max:
            return
        delivery.delay = self.config.resend_max
        if delivery.timer is not None:
            delivery.timer.cancel()
            self._next_try(tracked, delivery)

    def stop(self, tracked: TrackedRequest) -> None:
        """Stop re-sending: acknowledged, answered or ended; its child's work is done."""
        delivery = self._tracker.undeliver(tracked)
        if delivery is None:
            return
        if delivery.timer is not None:
            delivery.timer.cancel()
        if delivery.cause is not None and self._budgets is not None:
            self._budgets.finished(delivery.cause)

    def close(self) -> None:
        """Stop re-sending: what is still unacknowledged stays in the outbox for the next start."""
        self._closed = True
        for tracked in self._tracker.delivering():
            delivery = self._tracker.undeliver(tracked)
            if delivery is not None and delivery.timer is not None:
                delivery.timer.cancel()

    def outlived(self, tracked: TrackedRequest, until: float | None = None) -> str | None:
        """Why a signed message may not be sent again (its window passed), or None."""
        return outlived(tracked.message, self.config.broker.signing, until)

    def _published(self, tracked: TrackedRequest, pending: asyncio.Future[PublishOutcome]) -> None:
        """The broker's answer to one publish: a PUBACK, a refusal, or a dropped connection."""
        if pending.cancelled():
            return
        outcome = pending.result()
        if outcome.accepted:
            self._tracker.dispatched(tracked.message_id)
            return
        if outcome.lost:
            # The connection dropped first: the next try re-sends it.
            log.info(
                "%s: will re-send %s: %s", self.config.name, tracked.message_id, outcome.reason
            )
            return
        if not tracked.final and not delivered(
            tracked.message, acknowledged=tracked.acknowledged.is_set()
        ):
            # The broker refused it (ACL): re-sending cannot help.
            self._metrics.delivery_failures += 1
            reason = f"the broker refused it: {outcome.reason}"
            self._give_up(tracked, SentState.FAILED, ErrorCode.DELIVERY_FAILED, reason)

    def _give_up(self, tracked: TrackedRequest, state: SentState, code: str, reason: str) -> None:
        self.stop(tracked)
        self._tasks.spawn(self.end(tracked, state, code, reason), "give-up")

    async def end(self, tracked: TrackedRequest, state: SentState, code: str, reason: str) -> None:
        """Give up on a sent message: it ends failed or expired, for good.

        The tracker moves at once, so an answer that comes later is late, never a success.
        Its "expired" or "failed" row and its leaving the outbox are one commit, and whoever
        waits for it hears of the end only once that commit is durable (`recorded`): after a
        restart nothing re-sends it (docs/ledger.md, terminal states).
        """
        if tracked.final:
            return
        message_id = tracked.message_id
        if state is SentState.EXPIRED:
            self._tracker.expired(message_id, reason)
        else:
            self._tracker.failed(message_id, code, reason)
        self._tracker.recording_end(tracked)
        try:
            await self._ledger.record_message(
                tracked.message,
                LedgerAction(state),
                outcome=code,
                reason=reason,
                outbox_done=message_id,
            )
        except VoxError as exc:
            # Not recorded: after a restart it may be re-sent, and its deadline (which a
            # request carries) still makes its receiver refuse it once passed.
            log.warning("%s: the end of %s is not recorded: %s", self.config.name, message_id, exc)
        finally:
            self._tracker.end_recorded(tracked)

    @staticmethod
    async def recorded(tracked: TrackedRequest) -> None:
        """Wait until the end of a message given up is durable (at once if none is pending)."""
        if tracked.ending is not None:
            await asyncio.shield(tracked.ending)
