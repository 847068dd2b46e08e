"""Answers, acknowledgements and reports taken only from the agent their request went to.

A compromised leaf that learned its sibling's request id must not end that request: its
answer is refused before anything is acknowledged, settled or relayed, counted, and
recorded by size and digest within the peer's budget (docs/security.md, F24).
"""

from __future__ import annotations

import logging
import time
from typing import Final
from uuid import UUID

from vox_mqtt.agent.plan import ANSWERS
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.rules import WRONG_ANSWERER, answered_request, answerer_problem
from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.statusbounds import ChangeBudget
from vox_mqtt.protocol.messages import VOXMessage

__all__ = ["WRONG_ROWS_BURST", "WRONG_ROWS_EVERY", "AnswerGuard"]

log = logging.getLogger("vox_mqtt.agent")

# What one peer's refused answers may cost the ledger: this many rows at once, then one per
# WRONG_ROWS_EVERY seconds; beyond that they are only counted (`rejected{WRONG_ANSWERER}`).
WRONG_ROWS_BURST: Final = 20
WRONG_ROWS_EVERY: Final = 10.0


class AnswerGuard:
    """Refuse what settles a sent request unless it comes from the agent it was sent to."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: VOXAgentMemory,
        tracker: RequestTracker,
        metrics: AgentMetrics,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._tracker = tracker
        self._metrics = metrics
        # Per peer (the master and children only: a message is admitted first), what its
        # refused answers may still cost the ledger.
        self._rows: dict[UUID, ChangeBudget] = {}

    async def refused(self, message: VOXMessage, topic: str, payload: bytes) -> bool:
        """Tell whether an admitted message was refused here (and count and record it)."""
        named = answered_request(message)
        if named is None:
            return False
        problem = answerer_problem(message, await self._sent_to(named, message))
        if problem is None:
            return False
        self._metrics.rejected.inc(WRONG_ANSWERER)
        name = self._settings().name
        now = time.monotonic()
        budget = self._rows.setdefault(
            message.source,
            ChangeBudget(
                burst=WRONG_ROWS_BURST, rate=1 / WRONG_ROWS_EVERY, tokens=WRONG_ROWS_BURST
            ),
        )
        if not budget.allows(now):
            log.debug("%s: refused (counted, over its row budget) %s", name, problem)
            return True
        budget.take(now)
        log.warning("%s: refused %s", name, problem)
        await self._ledger.record_rejected(
            payload,
            f"{WRONG_ANSWERER}: {problem}",
            topic=topic,
            source=message.source,
            message_id=message.message_id,
        )
        return True

    async def _sent_to(self, request_id: UUID, message: VOXMessage) -> UUID | None:
        """Return the agent a request this agent sent went to; None if it sent no such request.

        The tracker knows every request still open (and the recent ended ones); an answer
        to an older one reads the ledger's "sent" row, as its plan's facts do
        (InboundPipeline._answer_facts).
        """
        tracked = self._tracker.get(request_id)
        if tracked is not None:
            return tracked.message.target
        if message.type not in ANSWERS:
            return None  # an untracked ack or report settles nothing: no ledger read for it
        me = str(self._settings().id)
        for row in await self._ledger.find(request_id):
            if row["action"] == LedgerAction.SENT and row["source"] == me and row["target"]:
                return UUID(str(row["target"]))
        return None
