"""Idempotent commands: their handler starts while their record commits, and a quick answer
commits with that record and stands for the acknowledgement (docs/ledger.md, docs/messages.md).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Peer, operator_config, settings_for, start_agents, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandRequest,
    new_message,
    serialize,
)
from vox_mqtt.transport.session import Session


class Lookup(Role):
    """A read-only command, declared idempotent, and a slow one."""

    runs = 0

    @command(idempotent=True)
    async def lookup(self, key: str) -> dict[str, Any]:
        Lookup.runs += 1
        return {"key": key, "value": len(key)}

    @command(idempotent=True)
    async def slow_lookup(self, key: str) -> str:
        await asyncio.sleep(0.2)  # far past the window: acknowledged as usual
        return key


# These tests count commits and acks of one command. On a loaded machine an answer slower
# than the operator's first re-send (0.3 s in agentkit) brings a re-sent copy, whose
# `duplicate` row is a commit of its own and whose ack is one more: no re-send while counted.
NO_RESEND = {"resend_initial": 30.0}


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet({"root": None})


async def outbox_empties(agent: VOXAgent) -> None:
    async with asyncio.timeout(10):
        while await agent.memory.pending_outbox():  # noqa: ASYNC110 - the ledger is polled
            await asyncio.sleep(0.02)


def sent(agent: VOXAgent, kind: str) -> int:
    return int(agent.metrics.snapshot()["counters"]["messages_out"].get(kind, 0))


async def test_a_quick_idempotent_command_is_one_commit_and_its_answer_is_its_ack(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root = (await start_agents(stack, secure, tmp_path, {"root": [Lookup()]}))["root"]
        operator = await stack.enter_async_context(
            VOXAgent(operator_config(secure, tmp_path, **NO_RESEND))
        )
        await operator.request("lookup", {"key": "warm"}, to=root.id, timeout=10)
        await outbox_empties(root)
        await outbox_empties(operator)
        commits, acks = root.memory.commit_count, sent(root, MSG_ACKNOWLEDGED)
        results = sent(root, MSG_COMMAND_RESULT)
        reply = await operator.request("lookup", {"key": "abc"}, to=root.id, timeout=10)
        assert reply.details["result"] == {"key": "abc", "value": 3}
        await outbox_empties(root)  # the answer never entered it: it is held for replay
        await outbox_empties(operator)  # the answer took the request out of the outbox
        # One commit holds received, started, the answer's sent and completed; nothing
        # acknowledges the answer (docs/messages.md), so there is no other.
        assert root.memory.commit_count - commits == 1
        assert sent(root, MSG_ACKNOWLEDGED) == acks  # no ack: the answer stood for it
        assert sent(root, MSG_COMMAND_RESULT) == results + 1
        request = reply.reply_to
        assert request is not None
        rows = [(r["action"], r["message_type"]) for r in await root.memory.get_recent(20)]
        mine = [r for r in await root.memory.get_recent(20) if r["message_id"] == str(request)]
        assert [r["action"] for r in sorted(mine, key=lambda r: r["id"])] == [
            "received",
            "started",
            "completed",
        ]
        assert ("sent", "command_result") in rows
        assert (await root.memory.verify()).ok


async def test_a_slow_idempotent_command_is_acknowledged_first(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root = (await start_agents(stack, secure, tmp_path, {"root": [Lookup()]}))["root"]
        operator = await stack.enter_async_context(
            VOXAgent(operator_config(secure, tmp_path, **NO_RESEND))
        )
        acks = sent(root, MSG_ACKNOWLEDGED)
        reply = await operator.request("slow_lookup", {"key": "k"}, to=root.id, timeout=10)
        assert reply.details["result"] == "k"
        assert sent(root, MSG_ACKNOWLEDGED) == acks + 1
        await outbox_empties(operator)


async def test_a_duplicate_of_a_quick_command_gets_its_answer_replayed_not_run_again(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    Lookup.runs = 0
    async with AsyncExitStack() as stack:
        root = (await start_agents(stack, secure, tmp_path, {"root": [Lookup()]}))["root"]
        session = await stack.enter_async_context(
            Session(
                settings_for(secure, fleet.operator_name),
                subscriptions=[topics.inbox_filter(fleet.operator_id)],
            )
        )
        operator = Peer(session, fleet.operator_name)
        pump = asyncio.ensure_future(operator.pump())
        stack.callback(pump.cancel)
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=fleet.operator_id,
            target=root.id,
            details=CommandRequest(command="lookup", params={"key": "twice"}),
        )
        topic = topics.inbox(root.id, fleet.operator_id)
        await operator.session.publish(topic, serialize(request))
        await wait_for(lambda: operator.of_type(MSG_COMMAND_RESULT), timeout=10)
        assert operator.of_type(MSG_ACKNOWLEDGED) == []  # the result stood for it
        await operator.session.publish(topic, serialize(request))  # a re-send
        # The answer recorded goes again, the same message, and stands for the ack again.
        await wait_for(lambda: len(operator.of_type(MSG_COMMAND_RESULT)) == 2, timeout=10)
        first, again = operator.of_type(MSG_COMMAND_RESULT)
        assert again.message_id == first.message_id
        assert again.details == first.details
        assert operator.of_type(MSG_ACKNOWLEDGED) == []
        assert Lookup.runs == 1
        rows = await root.memory.find(request.message_id)
        assert [r["action"] for r in rows] == ["received", "started", "completed", "duplicate"]
