"""What an agent publishes once, never re-sent: acks, and answers to commands (docs/messages.md).

An ack's rows are durable before it is published (agent/inbound.py); if it is lost, the
sender re-sends its message until acknowledged and the duplicate gets a new ack. So an ack
needs no outbox entry: `soon` publishes it without a task waiting for its PUBACK, and
`flush` waits (bounded) for those still on their way before the agent leaves. An answer to
a command is the same (`once`): its "sent" row is durable first, and if it is lost, the
requester re-sends the request and the answer held for replay goes again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any
from uuid import UUID

from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.ports import Publisher, Recorder, Settings
from vox_mqtt.agent.sendrules import check_size
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import DeliveryFailed, InvalidMessage, VoxError
from vox_mqtt.protocol.messages import MSG_ACKNOWLEDGED, VOXMessage, parse, serialize
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.outcome import PublishOutcome
from vox_mqtt.transport.publishprops import PublishProperties

__all__ = ["AckSender"]

log = logging.getLogger("vox_mqtt.agent")


class AckSender:
    """Publish acks now; know which are still on their way to their PUBACK."""

    def __init__(
        self,
        *,
        settings: Settings,
        publisher: Publisher,
        props: PublishProperties,
        metrics: AgentMetrics,
        tasks: TaskSet,
        ledger: Recorder,
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._props = props
        self._metrics = metrics
        self._tasks = tasks
        self._ledger = ledger
        self._acking: set[asyncio.Future[Any]] = set()  # acks not yet PUBACKed

    @property
    def config(self) -> AgentConfig:
        return self._settings()

    def soon(self, message: VOXMessage, ack: VOXMessage) -> None:
        """Publish the ack of a message now, without a task waiting for its PUBACK.

        Its rows are durable already. A failure is only logged: the sender re-sends until
        acknowledged, and its duplicate gets a new ack. flush() waits for it before the
        agent leaves.
        """
        topic = topics.inbox(message.source, self.config.id)
        props = self._props.inbox(message.source, MSG_ACKNOWLEDGED)
        try:
            outcome = self._publisher.publish_soon(topic, serialize(ack), props=props)
        except VoxError as exc:
            log.warning("%s: ack for %s not sent: %s", self.config.name, message.message_id, exc)
            return
        if outcome is None:  # no connection up: wait for one in the background
            outcome = self._tasks.spawn(self.publish(message, ack), "ack")
        else:
            self._metrics.messages_out.inc(MSG_ACKNOWLEDGED)
            outcome.add_done_callback(functools.partial(self._acked, message.message_id))
        self._acking.add(outcome)
        outcome.add_done_callback(self._acking.discard)

    def once(self, message: VOXMessage, payload: bytes) -> None:
        """Publish a message whose rows are durable once, now, never re-sent (an answer).

        A failure is only logged: its requester re-sends the request and gets it replayed.
        flush() waits for it before the agent leaves.
        """
        topic = topics.inbox(message.target, self.config.id)
        props = self._props.inbox(message.target, message.type)
        try:
            outcome = self._publisher.publish_soon(topic, payload, props=props)
        except VoxError as exc:
            log.info("%s: %s not sent: %s", self.config.name, message.message_id, exc)
            return
        if outcome is None:
            # No connection up: the requester re-sends once one is, and gets it replayed.
            log.info("%s: %s not sent: no connection", self.config.name, message.message_id)
            return
        self._metrics.messages_out.inc(message.type)
        outcome.add_done_callback(functools.partial(self._acked, message.message_id))
        self._acking.add(outcome)
        outcome.add_done_callback(self._acking.discard)

    async def record_once(self, message: VOXMessage) -> None:
        """Record and publish a message once, never re-sent: a refusal's error.

        The message it answers was refused, so never acknowledged: its sender re-sends it
        until answered or given up, and each copy is refused and answered again (within the
        peer's budget, docs/security.md).
        """
        payload = serialize(message)
        check_size(message, payload, self.config.max_message_bytes)
        await self._ledger.record_message(message, LedgerAction.SENT)
        self.once(message, payload)

    def replay(self, payload: bytes) -> None:
        """Publish once more an answer held for replay, as it was recorded (same id)."""
        try:
            answer = parse(payload, max_bytes=self.config.max_message_bytes)
        except InvalidMessage as exc:
            log.warning("%s: an answer held for replay does not parse: %s", self.config.name, exc)
            return
        self.once(answer, payload)

    def _acked(self, message_id: UUID, pending: asyncio.Future[PublishOutcome]) -> None:
        if pending.cancelled():
            return
        name = self.config.name
        outcome = pending.result()
        if outcome.lost:
            # The connection dropped (or was closed) first: the sender will re-send.
            self._metrics.delivery_failures += 1
            log.info("%s: ack for %s not confirmed: %s", name, message_id, outcome.reason)
        elif outcome.refused:
            self._metrics.delivery_failures += 1
            log.warning(
                "%s: the broker refused the ack for %s: %s", name, message_id, outcome.reason
            )

    async def flush(self, timeout: float) -> None:
        """Wait (up to timeout) for the acks still on their way to their PUBACK.

        Acks owed go out before the agent leaves, or the peer keeps re-sending what this
        agent already holds: a one-shot `vox send` would leave the root re-sending its answer.
        """
        if self._acking:
            await asyncio.wait(list(self._acking), timeout=timeout)

    async def publish(self, message: VOXMessage, ack: VOXMessage) -> None:
        """Publish the ack of a message; both their rows are durable (never tracked or re-sent)."""
        session = self._publisher
        self._metrics.messages_out.inc(MSG_ACKNOWLEDGED)
        try:
            await session.publish(
                topics.inbox(message.source, self.config.id),
                serialize(ack),
                props=self._props.inbox(message.source, MSG_ACKNOWLEDGED),
            )
        except DeliveryFailed as exc:
            self._metrics.delivery_failures += 1
            # The sender re-sends until acknowledged; its duplicate gets a new ack.
            log.warning(
                "%s: ack for %s not delivered: %s", self.config.name, message.message_id, exc
            )
