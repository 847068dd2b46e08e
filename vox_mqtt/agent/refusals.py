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
from vox_mqtt.agent.plan import Reject, Retained, Unrecordable
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.prepared import Staged, Taken, nothing_recorded
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

__all__ = [
    "RETAINED_HELP",
    "UNKNOWN_CANCEL",
    "Refusals",
    "RejectStep",
    "RetainedStep",
    "UnrecordableStep",
]

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
        self.metrics = metrics
        self.outbox = outbox
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
        self.metrics.rejected.inc(reason)
        if not self.recordable(topic.source, reason):
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
            self.outbox.settle_ack(message)  # our own message arrived: stop re-sending it
        elif message.type == MSG_COMMAND_REQUEST:
            error = CommandError(
                code=ErrorCode.LEDGER_UNAVAILABLE,
                error=f"{self.config.name} cannot record, so it accepts no work: {failure}"[:1000],
                command=str(message.details.get("command", "")) or None,
            )
            await self.outbox.publish_unrecorded(message.reply(MSG_COMMAND_ERROR, error))
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
        self.metrics.rejected.inc(STALE)
        if not self.recordable(message.source, STALE):
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

    async def unparsable(
        self, inbound: Inbound, topic: topics.InboxTopic, exc: InvalidMessage
    ) -> None:
        self.metrics.rejected.inc(ErrorCode.INVALID_MESSAGE)
        if not self.recordable(topic.source, ErrorCode.INVALID_MESSAGE):
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
            await self.outbox.send_error_to(
                topic.source, exc.message_id, ErrorCode.INVALID_MESSAGE, exc.reason
            )

    def recordable(self, peer: object, reason: str) -> bool:
        """Within the peer's budget a refusal is recorded (and answered); beyond, counted.

        Each recorded refusal costs the ledger about 3.3 KB, and an error to a peer is
        re-sent until acknowledged (docs/security.md, "Costs of a peer's messages").
        """
        if self._peers.allow(str(peer)):
            return True
        self.metrics.unrecorded.inc(reason)
        return False

    def unknown_cancel_allowed(self, peer: object) -> bool:
        """Spend a peer's budget for a cancel naming a request never received; False: spent."""
        if self._unknown_cancels.allow(str(peer)):
            return True
        self.metrics.unrecorded.inc(UNKNOWN_CANCEL)
        return False

    async def answer_unrecorded(self, message: VOXMessage) -> None:
        """Ack a cancel beyond the budget and report "unknown": no row, nothing remembered."""
        report = await self._lifecycle.answer_unrecorded(message)
        replies = self._unrecorded_replies
        replies[report.message_id] = None
        if len(replies) > UNRECORDED_REPLIES:
            del replies[next(iter(replies))]
        # The report proves receipt; the ack stops the sender's re-sends at once anyway.
        ack = acknowledge(message, message_source=self.config.message_source)
        await self.outbox.acks.publish(message, ack)


class RejectStep:
    """Refuse a message from a peer that may not send it there: recorded, answered if a peer's."""

    def __init__(self, refusals: Refusals) -> None:
        self._refusals = refusals

    async def stage(self, taken: Taken, plan: Reject) -> Staged:
        refusals = self._refusals
        refusals.metrics.rejected.inc(plan.code)
        if not refusals.recordable(taken.inbox.source, plan.code):
            return nothing_recorded()  # neither recorded nor answered: the peer spent its budget
        return Staged(action=LedgerAction.REJECTED, outcome=plan.code, reason=plan.reason)

    async def execute(self, taken: Taken, plan: Reject, staged: Staged) -> None:
        if not staged.commits:
            return
        message, source = taken.message, taken.inbox.source
        config = self._refusals.config
        log.warning("%s: rejected %s from %s: %s", config.name, message.type, source, plan.reason)
        if source in config.peers and message.type != MSG_ACKNOWLEDGED:
            await self._refusals.outbox.send_error_to(
                source, message.message_id, plan.code, plan.reason
            )

    def drop(self, taken: Taken, plan: Reject, staged: Staged) -> None:
        """Nothing was taken for it."""


class RetainedStep:
    """A retained message in an inbox: recorded each time, never executed, acked or answered.

    The broker re-delivers a retained message on every new subscription (docs/broker.md).
    """

    def __init__(self, refusals: Refusals) -> None:
        self._refusals = refusals

    async def stage(self, taken: Taken, plan: Retained) -> Staged:
        if not self._refusals.recordable(taken.message.source, ErrorCode.INVALID_MESSAGE):
            return nothing_recorded()
        reason = f"{plan.reason} ({RETAINED_HELP})"
        return Staged(
            action=LedgerAction.REJECTED, outcome=ErrorCode.INVALID_MESSAGE, reason=reason
        )

    async def execute(self, taken: Taken, plan: Retained, staged: Staged) -> None:
        if staged.commits:
            name = self._refusals.config.name
            log.warning(
                "%s: rejected %s on %s: %s", name, taken.message.type, taken.topic, staged.reason
            )

    def drop(self, taken: Taken, plan: Retained, staged: Staged) -> None:
        """Nothing was taken for it."""


class UnrecordableStep:
    """Accept nothing that cannot be recorded: no row, no ack; a command hears why."""

    def __init__(self, refusals: Refusals) -> None:
        self._refusals = refusals

    async def stage(self, taken: Taken, plan: Unrecordable) -> Staged:
        return nothing_recorded()

    async def execute(self, taken: Taken, plan: Unrecordable, staged: Staged) -> None:
        await self._refusals.unrecordable(taken.message, plan.reason)

    def drop(self, taken: Taken, plan: Unrecordable, staged: Staged) -> None:
        """Nothing was taken for it."""
