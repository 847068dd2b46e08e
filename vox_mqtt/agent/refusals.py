"""What an agent refuses, and what a peer's refusals may cost its ledger (docs/security.md).

A message the pipeline does not admit (agent/plan.py `admit`) is refused here: forged or
unparsable, outside the replay window (STALE), from a peer it may not come from, retained in
an inbox, or one that cannot be recorded. Within a peer's budget a refusal is recorded and,
where the protocol says so, answered; beyond it, it is only counted (`unrecorded`): each
recorded refusal costs the ledger about 3.3 KB and an error is re-sent until acknowledged
("Costs of a peer's messages"). A cancel for a request never received is answered
"unknown" within its own budget, and beyond it acknowledged and answered unrecorded.
"""

from __future__ import annotations

import logging
import time
from uuid import UUID

from vox_mqtt.agent.budget import CANCEL_BUDGET, REFUSAL_BUDGET, PeerBudgets
from vox_mqtt.agent.lifecycle import Lifecycle
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import CancelAction, Plan, Step
from vox_mqtt.agent.ports import Settings
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.acks import acknowledge
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    CommandError,
    ErrorCode,
    VOXMessage,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.signing import STALE, SignedTopic, replay_problem
from vox_mqtt.transport.session import Inbound

__all__ = ["RETAINED_HELP", "UNKNOWN_CANCEL", "Refusals"]

log = logging.getLogger("vox_mqtt.agent")

RETAINED_HELP = "publish an empty retained message on the topic, docs/broker.md"
UNKNOWN_CANCEL = "unknown_cancel"  # the unrecorded counter's reason for one (agent/budget.py)
UNRECORDED_REPLIES = 1024  # reports sent unrecorded whose acks are not recorded either


class Refusals:
    """Refuse what the pipeline does not admit, within each peer's budget."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: VOXAgentMemory,
        metrics: AgentMetrics,
        outbox: Outbox,
        lifecycle: Lifecycle,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._metrics = metrics
        self._outbox = outbox
        self._lifecycle = lifecycle
        self._peers = PeerBudgets(REFUSAL_BUDGET)
        self._unknown_cancels = PeerBudgets(CANCEL_BUDGET)
        self._unrecorded_replies: dict[UUID, None] = {}

    @property
    def config(self) -> AgentConfig:
        return self._settings()

    async def forged(self, inbound: Inbound, topic: topics.InboxTopic, forgery: str) -> None:
        """Refuse what the session judged forged before parsing it (docs/security.md)."""
        reason = forgery.partition(":")[0]
        self._metrics.rejected.inc(reason)
        if not self._recordable(topic.source, reason):
            return
        await self._ledger.record_rejected(
            inbound.payload, forgery, topic=inbound.topic, source=None, message_id=None
        )

    def unrecorded_ack(self, done: UUID) -> bool:
        """Tell whether an ack is for a report sent unrecorded (then it is unrecorded too)."""
        if done in self._unrecorded_replies:
            del self._unrecorded_replies[done]
            return True
        return False

    async def refuse(
        self, message: VOXMessage, inbound: Inbound, topic: topics.InboxTopic, plan: Plan
    ) -> None:
        """Carry out a plan that does not admit a message."""
        if plan.step is Step.REJECT:
            await self._reject(message, inbound, topic, plan.reason)
        elif plan.step is Step.RETAINED:
            await self._reject_retained(message, inbound)
        else:
            await self.unrecordable(message, plan.reason)

    async def unrecordable(self, message: VOXMessage, failure: str) -> None:
        """Accept nothing that cannot be recorded: no ack, and a command gets a clear error."""
        log.warning(
            "%s: refused %s %s: cannot record it: %s",
            self.config.name,
            message.type,
            message.message_id,
            failure,
        )
        if message.type == MSG_ACKNOWLEDGED:
            self._outbox.settle_ack(message)  # our own message arrived: stop re-sending it
        elif message.type == MSG_COMMAND_REQUEST:
            error = CommandError(
                code=ErrorCode.LEDGER_UNAVAILABLE,
                error=f"{self.config.name} cannot record, so it accepts no work: {failure}"[:1000],
                command=str(message.details.get("command", "")) or None,
            )
            await self._outbox.publish_unrecorded(message.reply(MSG_COMMAND_ERROR, error))
        # Anything else is not acknowledged: its sender re-sends it (up to its timeout).

    async def stale(self, inbound: Inbound, message: VOXMessage) -> bool:
        """Refuse a signed message outside the replay window (STALE); return whether it was.

        A signed emitted_at is the sender's own: older than the window, it is a replay the
        dedupe index may no longer know, and its sender stopped re-sending it at the window
        (docs/security.md, replays). An unsigned one proves nothing by its age.
        """
        signing = self.config.broker.signing
        if signing is None or not isinstance(inbound.topic, SignedTopic):
            return False
        stale = replay_problem(
            message.emitted_at, time.time(), signing.replay_window, signing.clock_skew
        )
        if stale is None:
            return False
        self._metrics.rejected.inc(STALE)
        if not self._recordable(message.source, STALE):
            return True
        log.info("%s: refused %s: %s", self.config.name, message.message_id, stale)
        await self._ledger.record_rejected(
            inbound.payload,
            stale,
            topic=inbound.topic,
            source=message.source,
            message_id=message.message_id,
        )
        return True

    async def _reject(
        self, message: VOXMessage, inbound: Inbound, topic: topics.InboxTopic, problem: str
    ) -> None:
        self._metrics.rejected.inc(ErrorCode.UNAUTHORIZED_SOURCE)
        if not self._recordable(topic.source, ErrorCode.UNAUTHORIZED_SOURCE):
            return  # neither recorded nor answered: the peer spent its budget
        log.warning(
            "%s: rejected %s from %s: %s", self.config.name, message.type, topic.source, problem
        )
        await self._ledger.record_message(
            message,
            LedgerAction.REJECTED,
            outcome=ErrorCode.UNAUTHORIZED_SOURCE,
            reason=problem,
            topic=inbound.topic,
        )
        if topic.source in self.config.peers and message.type != MSG_ACKNOWLEDGED:
            await self._outbox.send_error_to(
                topic.source, message.message_id, ErrorCode.UNAUTHORIZED_SOURCE, problem
            )

    async def _reject_retained(self, message: VOXMessage, inbound: Inbound) -> None:
        # The broker re-delivers a retained message on every new subscription: it is
        # recorded each time and never executed, acked or answered (docs/broker.md).
        reason = f"retained message in an inbox: never executed ({RETAINED_HELP})"
        if not self._recordable(message.source, ErrorCode.INVALID_MESSAGE):
            return
        log.warning(
            "%s: rejected %s on %s: %s", self.config.name, message.type, inbound.topic, reason
        )
        await self._ledger.record_message(
            message,
            LedgerAction.REJECTED,
            outcome=ErrorCode.INVALID_MESSAGE,
            reason=reason,
            topic=inbound.topic,
        )

    async def unparsable(
        self, inbound: Inbound, topic: topics.InboxTopic, exc: InvalidMessage
    ) -> None:
        self._metrics.rejected.inc(ErrorCode.INVALID_MESSAGE)
        if not self._recordable(topic.source, ErrorCode.INVALID_MESSAGE):
            return
        log.warning(
            "%s: rejected a message from %s: %s", self.config.name, topic.source, exc.reason
        )
        await self._ledger.record_rejected(
            inbound.payload,
            exc.reason,
            topic=inbound.topic,
            source=topic.source,
            message_id=exc.message_id,
        )
        # The sender is known from the topic (the broker lets it write only there).
        if topic.source in self.config.peers and exc.message_id is not None:
            await self._outbox.send_error_to(
                topic.source, exc.message_id, ErrorCode.INVALID_MESSAGE, exc.reason
            )

    def _recordable(self, peer: object, reason: str) -> bool:
        """Within the peer's budget a refusal is recorded (and answered); beyond, counted.

        Each recorded refusal costs the ledger about 3.3 KB, and an error to a peer is
        re-sent until acknowledged (docs/security.md, "Costs of a peer's messages").
        """
        if self._peers.allow(str(peer)):
            return True
        self._metrics.unrecorded.inc(reason)
        return False

    def unknown_beyond_budget(self, plan: Plan, topic: topics.InboxTopic) -> bool:
        """Tell whether a cancel names a request never received, beyond its sender's budget."""
        if plan.step is not Step.CANCEL or plan.cancel is not CancelAction.REMEMBER:
            return False
        if self._unknown_cancels.allow(str(topic.source)):
            return False
        self._metrics.unrecorded.inc(UNKNOWN_CANCEL)
        return True

    async def answer_unrecorded(self, message: VOXMessage) -> None:
        """Ack a cancel beyond the budget and report "unknown": no row, nothing remembered."""
        report = await self._lifecycle.answer_unrecorded(message)
        replies = self._unrecorded_replies
        replies[report.message_id] = None
        if len(replies) > UNRECORDED_REPLIES:
            del replies[next(iter(replies))]
        # The report proves receipt; the ack stops the sender's re-sends at once anyway.
        ack = acknowledge(message, message_source=self.config.message_source)
        await self._outbox.acks.publish(message, ack)
