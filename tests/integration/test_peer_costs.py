"""What a peer's messages cost its master's ledger is bounded (docs/security.md, Costs).

In-process agents on a real (secure) broker: a compromised child that signs with its own
login and key floods its master with refused messages; an operator cancels requests that
never existed. Within the sender's budget (agent/budget.py) each is recorded as before;
beyond it, counted in `unrecorded` and nothing is written, no error re-sent, nothing kept.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.kits.agentkit import operator_config, start_agents, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent import remembered
from vox_mqtt.agent.budget import CANCEL_BUDGET, REFUSAL_BUDGET
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST, MSG_STATUS_QUERY
from vox_mqtt.protocol.messages import MSG_COMMAND_ERROR, ErrorCode, new_message, serialize

FLOOD = 200
# The budget's burst, plus what its rate refills while the flood is taken in (generous).
SLACK = 10


class Worker(Role):
    @command
    async def hold(self, seconds: float = 0.1) -> str:
        await asyncio.sleep(seconds)
        return "held"


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet({"root": None, "coordinator": "root"})


async def rows(agent: VOXAgent, **match: str) -> list[dict[str, Any]]:
    return [
        r for r in await agent.memory.get_recent(10_000) if all(r[k] == v for k, v in match.items())
    ]


async def test_a_childs_flood_of_refused_messages_costs_its_budget_not_a_row_each(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    """Before: 200 rows (3.3 KB each) and 200 errors re-sent to the child."""
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {"coordinator": [Worker()]})
        root, coord = agents["root"], agents["coordinator"]
        for n in range(FLOOD):  # only its master may ask: refused UNAUTHORIZED_SOURCE
            kind = MSG_STATUS_QUERY if n % 2 else MSG_CANCEL_REQUEST
            message = new_message(
                kind, source=coord.id, target=root.id, details={"request_id": str(uuid4())}
            )
            # Published once, as the child's own session sends it: no re-send to count twice.
            await coord._session.publish(topics.inbox(root.id, coord.id), serialize(message))

        def counted() -> int:
            return root.metrics.rejected.values.get(ErrorCode.UNAUTHORIZED_SOURCE, 0)

        await wait_for(lambda: counted() >= FLOOD, timeout=30)
        unrecorded = root.metrics.unrecorded.values.get(ErrorCode.UNAUTHORIZED_SOURCE, 0)
        async with asyncio.timeout(10):  # the last rows are written after their count
            while len(refused := await rows(root, action="rejected")) + unrecorded < FLOOD:  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        assert len(refused) + unrecorded == FLOOD
        assert REFUSAL_BUDGET.burst <= len(refused) <= REFUSAL_BUDGET.burst + SLACK

        async def errors() -> int:
            return len(await rows(root, action="sent", message_type=MSG_COMMAND_ERROR))

        async with asyncio.timeout(10):  # each recorded refusal's error is sent after its row
            while await errors() < len(refused):  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert await errors() == len(refused)  # an error only for a recorded refusal
        # The master still serves its child's genuine traffic: the budget is for refusals.
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        await wait_for(lambda: "hold" in root.advertised_commands())
        reply = await operator.request("hold", {}, to=root.id, timeout=15)
        assert reply.details["result"] == "held"


async def test_cancels_for_requests_never_sent_cost_their_budget_and_are_all_answered(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 4 rows (about 4.4 KB) and about 8 MiB of memory per thousand, for good."""
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {"coordinator": [Worker()]})
        root = agents["root"]
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        reports: list[dict[str, Any]] = []
        for _ in range(FLOOD // 20):
            batch = [operator.cancel(uuid4(), timeout=20) for _ in range(20)]
            reports += await asyncio.gather(*batch)
        assert [r["state"] for r in reports] == ["unknown"] * FLOOD  # every one answered
        # The operator re-sends a cancel not answered within its first re-send (0.3 s in
        # agentkit): on a loaded machine some are, and each copy is taken again, as any
        # peer's copy would be. A copy of a recorded cancel is a `duplicate` row; a copy of an
        # unrecorded one is counted again (or, the budget refilled meanwhile, recorded). So
        # the counts are of distinct cancels, bounded by the copies the operator sent.
        cancels = await rows(root, action="received", message_type=MSG_CANCEL_REQUEST)
        recorded = {r["message_id"] for r in cancels}
        assert len(recorded) == len(cancels)  # a cancel is recorded once, copies or not
        assert CANCEL_BUDGET.burst <= len(cancels) <= CANCEL_BUDGET.burst + SLACK
        copies = operator.metrics.resends
        unrecorded = root.metrics.unrecorded.values["unknown_cancel"]
        assert FLOOD - len(cancels) <= unrecorded <= FLOOD - len(cancels) + copies
        await asyncio.sleep(1.0)  # the operator's acks of the reports have come back
        every = await root.memory.get_recent(10_000)
        for_cancels = [r for r in every if r["message_type"] in ("cancel_request", "cancel_report")]
        # Nothing for the unrecorded ones: every row names a recorded cancel, as itself (its
        # `received` row, a copy's `duplicate` row) or as what it answers (its report).
        duplicates = [r for r in for_cancels if r["action"] == "duplicate"]
        assert {r["message_id"] for r in duplicates} <= recorded
        assert len(duplicates) <= copies
        reports_sent = [r for r in for_cancels if r["message_type"] == "cancel_report"]
        assert sorted(r["reply_to"] for r in reports_sent) == sorted(recorded)  # one each
        assert all(r["action"] == "sent" for r in reports_sent)
        assert len(for_cancels) == 2 * len(cancels) + len(duplicates)
        assert root._lifecycle.remembered == len(cancels)
        # The window: remembered for REMEMBER_WINDOW (600 s), then not. It is read when the
        # old ones are forgotten, so it is shortened only now: a flood slowed by a loaded
        # machine had outlived a 3 s window before this check (remembered 0, not 32).
        monkeypatch.setattr(remembered, "REMEMBER_WINDOW", 0.5)
        await asyncio.sleep(1.0)
        assert root._lifecycle.remembered == 0
