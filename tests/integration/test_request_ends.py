"""A request's end is terminal, across restarts (docs/ledger.md, terminal states).

A request that expired at its requester is never re-sent and never run; an answer that
comes after is recorded as late and reported to no one as a success; a receiver honours
the deadline the request carries.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.agentkit import Tally, agent_config, open_peer, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.tracking import SentState
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    CommandError,
    CommandRequest,
    ErrorCode,
    new_message,
    serialize,
)


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet({"root": None, "specialist": "root"})


def actions(rows: list[dict[str, Any]]) -> list[str]:
    return [row["action"] for row in sorted(rows, key=lambda r: r["id"])]


def tally_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def test_a_request_that_expired_while_its_target_was_offline_never_runs(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    tally = tmp_path / "tally.txt"
    spec_id = fleet.agent("specialist").id

    def specialist() -> VOXAgent:
        config = agent_config(secure, "specialist", tmp_path)
        return VOXAgent(config, [Tally(settings={"tally_file": str(tally)})])

    async with AsyncExitStack() as stack:
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        # The specialist has never connected: the broker holds nothing for it, so only the
        # root's outbox could ever bring it this request.
        with pytest.raises(CommandFailed) as failed:
            await root.request("tally", {"n": 1}, to=spec_id, timeout=1.0)
        assert failed.value.code == ErrorCode.TIMEOUT
        (row,) = [r for r in await root.memory.get_recent(20) if r["action"] == "expired"]
        first = UUID(row["message_id"])
        assert actions(await root.memory.find(first)) == ["sent", "expired"]
        assert root.tracker.get(first).state is SentState.EXPIRED  # type: ignore[union-attr]
        assert await root.memory.pending_outbox() == []

    # The root restarts, and the specialist comes up: nothing re-sends the expired request.
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(specialist())
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        reply = await root.request("tally", {"n": 2}, to=spec_id, timeout=10)
        assert reply.details["result"] == 2
        async with asyncio.timeout(10):
            while await root.memory.pending_outbox():  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        assert tally_lines(tally) == ["2"]
        assert await spec.memory.find(first) == []  # it never even arrived
        assert actions(await root.memory.find(first)) == ["sent", "expired"]
        assert (await root.memory.verify()).ok


async def test_an_answer_after_the_requester_gave_up_is_recorded_late(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    spec_id = fleet.agent("specialist").id
    async with AsyncExitStack() as stack:
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        peer = await open_peer(stack, secure, "specialist")  # answers when the test says
        with pytest.raises(CommandFailed):
            await root.request("tally", {"n": 3}, to=spec_id, timeout=0.5)
        copies = peer.of_type(MSG_COMMAND_REQUEST)  # re-sent, never acknowledged
        assert len({m.message_id for m in copies}) == 1
        request = copies[0]
        # The specialist answers with success, after the root gave up at the deadline.
        late = request.reply(
            "command_result", {"command": "tally", "result": 3, "handled_by": str(spec_id)}
        )
        await peer.session.publish(topics.inbox(root.id, spec_id), serialize(late))

        async def late_row() -> list[dict[str, Any]]:
            return [r for r in await root.memory.find(late.message_id) if r["action"] == "late"]

        async with asyncio.timeout(10):
            while not await late_row():  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        (row,) = await late_row()
        assert row["outcome"] == "expired"
        tracked = root.tracker.get(request.message_id)
        assert tracked is not None
        assert tracked.state is SentState.EXPIRED
        assert tracked.reply is None  # never reported as the request's outcome


async def test_a_command_that_arrives_after_its_deadline_is_not_started(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    tally = tmp_path / "tally.txt"
    async with AsyncExitStack() as stack:
        config = agent_config(secure, "specialist", tmp_path)
        spec = await stack.enter_async_context(
            VOXAgent(config, [Tally(settings={"tally_file": str(tally)})])
        )
        master = await open_peer(stack, secure, "root")
        past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat(timespec="milliseconds")
        stale = new_message(
            MSG_COMMAND_REQUEST,
            source=fleet.agent("root").id,
            target=spec.id,
            details=CommandRequest(command="tally", params={"n": 4}, deadline=past),
        )
        await master.session.publish(topics.inbox(spec.id, master_id(fleet)), serialize(stale))
        await wait_for(lambda: master.of_type(MSG_COMMAND_ERROR), timeout=10)
        (answer,) = master.of_type(MSG_COMMAND_ERROR)
        error = answer.payload_as(CommandError)
        assert error.code == ErrorCode.TIMEOUT
        assert "after its deadline: not started" in error.error
        assert actions(await spec.memory.find(stale.message_id)) == ["received", "expired"]
        assert tally_lines(tally) == []


def master_id(fleet: Any) -> UUID:
    return fleet.agent("root").id  # type: ignore[no-any-return]
