"""The firewall at the receiver: the broker refuses, the agent verifies, bad input never stops."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.kits.agentkit import (
    JOB,
    Analyst,
    Slow,
    open_peer,
    operator_config,
    start_agents,
    wait_for,
)
from tests.kits.brokerkit import SEED_TREE, Witness, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import command
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_JOB_DETECTED
from vox_mqtt.protocol.errors import DeliveryFailed, VoxError
from vox_mqtt.protocol.messages import MSG_ACKNOWLEDGED, MSG_COMMAND_REQUEST, new_message, serialize


@pytest.fixture
def seed(secure_broker_factory: Any) -> Any:
    return secure_broker_factory(tree_fleet(SEED_TREE))


async def test_specialist_writing_to_the_root_is_refused_by_the_broker(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    root_id, spec_id = fleet.root.id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, names=["root"])
        # The independent witness reads everything under the root; the root's retained
        # status arriving proves its subscription is in place.
        witness = Witness(seed.creds("explorer"), f"vox/{root_id}/#")
        stack.callback(witness.close)
        await asyncio.to_thread(witness.wait_first, timeout=10)
        peer = await open_peer(stack, seed, "specialist_a")
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=spec_id,
            target=root_id,
            details={"command": "analyze", "params": {}},
        )
        with pytest.raises(DeliveryFailed) as refused:
            await peer.session.publish(topics.inbox(root_id, spec_id), serialize(request))
        assert refused.value.reason_code == 0x87
        await asyncio.sleep(0.5)
        assert not await agents["root"].memory.find(request.message_id)
        assert not [line for line in witness.lines if "/inbox/" in line]


async def test_agent_refuses_to_address_anyone_but_master_and_children(
    seed: Any, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, names=["specialist_a"])
        with pytest.raises(VoxError, match="only talk to its master and children"):
            await agents["specialist_a"].send(MSG_JOB_DETECTED, JOB, to=seed.fleet.root.id)


async def test_forged_source_is_rejected_and_answered_unauthorized(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    coord_id = fleet.agent("coordinator").id
    a_id, b_id = fleet.agent("specialist_a").id, fleet.agent("specialist_b").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, names=["coordinator"])
        peer = await open_peer(stack, seed, "specialist_a")
        forged = new_message(MSG_JOB_DETECTED, source=b_id, target=coord_id, details=JOB)
        await peer.session.publish(topics.inbox(coord_id, a_id), serialize(forged))
        await wait_for(lambda: peer.of_type("command_error"))
        [error] = peer.of_type("command_error")
        assert error.details["code"] == "UNAUTHORIZED_SOURCE"
        assert error.reply_to == forged.message_id
        rows = await agents["coordinator"].memory.find(forged.message_id)
        assert [r["action"] for r in rows] == ["rejected"]
        assert "does not match the sender" in rows[0]["reason"]
        # Counted where it happened: one rejection by reason, nothing taken in.
        metrics = agents["coordinator"].metrics
        assert metrics.rejected.values == {"UNAUTHORIZED_SOURCE": 1}
        assert metrics.messages_in.total() == 0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (b"x" * 5000, "over the 4096-byte limit"),
    ],
)
async def test_malformed_input_is_recorded_with_a_reason_and_the_agent_goes_on(
    seed: Any, tmp_path: Path, payload: bytes, reason: str
) -> None:
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack,
            seed,
            tmp_path,
            {"coordinator": [Analyst()]},
            names=["coordinator"],
            max_message_bytes=4096,
        )
        peer = await open_peer(stack, seed, "specialist_a")
        try:
            await peer.session.publish(topics.inbox(coord_id, a_id), payload)
        except DeliveryFailed:
            pytest.fail("the broker refused a payload the agent should judge")
        memory = agents["coordinator"].memory

        async def rejected() -> list[dict[str, Any]]:
            return [r for r in await memory.get_recent(20) if r["action"] == "rejected"]

        async with asyncio.timeout(10):
            while not await rejected():  # noqa: ASYNC110 - the ledger is the signal
                await asyncio.sleep(0.05)
        [row] = await rejected()
        assert reason in row["reason"]
        assert row["details"]["size"] == len(payload)
        # Still serving: a valid message from the same peer is acknowledged.
        job = new_message(MSG_JOB_DETECTED, source=a_id, target=coord_id, details=JOB)
        await peer.session.publish(topics.inbox(coord_id, a_id), serialize(job))
        await wait_for(lambda: peer.of_type(MSG_ACKNOWLEDGED))
        metrics = agents["coordinator"].metrics
        assert metrics.rejected.values == {"INVALID_MESSAGE": 1}
        assert metrics.messages_in.values[MSG_JOB_DETECTED] == 1


async def test_the_broker_itself_refuses_payloads_over_its_packet_limit(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, names=["coordinator"])
        peer = await open_peer(stack, seed, "specialist_a")
        with pytest.raises(DeliveryFailed):
            await peer.session.publish(topics.inbox(coord_id, a_id), b"x" * (2 * 1024 * 1024))
        await asyncio.sleep(0.3)
        assert not [
            r
            for r in await agents["coordinator"].memory.get_recent(20)
            if r["action"] == "received"
        ]


async def test_a_malformed_message_with_a_readable_id_gets_invalid_message(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        await start_agents(stack, seed, tmp_path, {}, names=["coordinator"])
        peer = await open_peer(stack, seed, "specialist_a")
        bad = json.loads(
            serialize(new_message(MSG_JOB_DETECTED, source=a_id, target=coord_id, details=JOB))
        )
        bad["details"]["price"]["value"] = -5
        await peer.session.publish(topics.inbox(coord_id, a_id), json.dumps(bad).encode())
        await wait_for(lambda: peer.of_type("command_error"))
        [error] = peer.of_type("command_error")
        assert error.details["code"] == "INVALID_MESSAGE"
        assert "price.value" in error.details["error"]
        assert str(error.reply_to) == bad["message_id"]


async def test_duplicates_are_reacknowledged_or_answered_again_and_never_re_executed(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    root_id, coord_id = fleet.root.id, fleet.agent("coordinator").id
    executions: list[str] = []

    class Counting(Slow):
        async def start(self) -> None:
            return None

        @command
        async def sleep(self, seconds: float) -> float:
            executions.append("run")
            return await super().sleep(seconds)

    counting = Counting()
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack, seed, tmp_path, {"coordinator": [counting]}, names=["coordinator"]
        )
        peer = await open_peer(stack, seed, "root")
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=root_id,
            target=coord_id,
            details={"command": "sleep", "params": {"seconds": 0.01}},
        )
        topic = topics.inbox(coord_id, root_id)
        for _ in range(3):
            await peer.session.publish(topic, serialize(request))
        metrics = agents["coordinator"].metrics
        await wait_for(lambda: peer.of_type("command_result"))
        await wait_for(lambda: metrics.duplicates == 2)
        # The first copy is acknowledged; each other one either again (it came while the
        # command ran) or by its recorded answer, replayed (docs/messages.md).
        await wait_for(
            lambda: len(peer.of_type(MSG_ACKNOWLEDGED)) + len(peer.of_type("command_result")) >= 4
        )
        acks, results = len(peer.of_type(MSG_ACKNOWLEDGED)), len(peer.of_type("command_result"))
        await peer.session.publish(topic, serialize(request))  # once more, after the answer
        await wait_for(lambda: len(peer.of_type("command_result")) == results + 1)
        assert len(peer.of_type(MSG_ACKNOWLEDGED)) == acks  # the answer stood for the ack
        assert executions == ["run"]
        # One result, the same message each time it was sent; nothing acknowledged it.
        assert len({m.message_id for m in peer.of_type("command_result")}) == 1
        assert metrics.duplicates == 3
        assert metrics.messages_in.values[MSG_COMMAND_REQUEST] == 1
        assert metrics.commands_served.values["sleep"] == 1
        assert metrics.messages_out.values["command_result"] == results + 1
        assert metrics.messages_out.values[MSG_ACKNOWLEDGED] == acks
        assert metrics.resends == 0  # an answer is never re-sent on a timer
        assert sum(metrics.command_handler_seconds.counts) == 1
        snapshot = metrics.snapshot()
        assert snapshot is not None
        assert snapshot["gauges"]["intake_queue"] == 0  # all taken in
        assert snapshot["gauges"]["inflight_commands"] == 0
        assert snapshot["gauges"]["ledger_bytes"] > 0
        assert snapshot["counters"]["ledger_records"] >= 5  # received x1, duplicate x3, ...


async def test_wrong_target_in_the_envelope_is_rejected(seed: Any, tmp_path: Path) -> None:
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, names=["coordinator"])
        peer = await open_peer(stack, seed, "specialist_a")
        stray = new_message(MSG_JOB_DETECTED, source=a_id, target=uuid4(), details=JOB)
        await peer.session.publish(topics.inbox(coord_id, a_id), serialize(stray))
        await wait_for(lambda: peer.of_type("command_error"))
        rows = await agents["coordinator"].memory.find(stray.message_id)
        assert rows[0]["action"] == "rejected"
        assert "is not this agent" in rows[0]["reason"]


async def test_operator_sees_only_the_root_answer_even_with_inbound_noise(
    seed: Any, tmp_path: Path
) -> None:
    """Garbage from a child while a command flows does not disturb the flow."""
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack,
            seed,
            tmp_path,
            {"specialist_b": [Analyst()]},
            names=["specialist_b", "coordinator", "root"],
        )
        await wait_for(lambda: "analyze" in agents["root"].advertised_commands())
        peer = await open_peer(stack, seed, "specialist_a")
        operator = await stack.enter_async_context(VOXAgent(operator_config(seed, tmp_path)))
        for junk in (b"", b"null", b"{}", b'{"type": 5}'):
            await peer.session.publish(topics.inbox(coord_id, a_id), junk)
        reply = await operator.request("analyze", {"target": "t"}, to=fleet.root.id, timeout=10)
        assert reply.details["result"]["by"] == "specialist_b"


async def test_a_child_cannot_command_its_master(seed: Any, tmp_path: Path) -> None:
    fleet = seed.fleet
    coord_id, a_id = fleet.agent("coordinator").id, fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        await start_agents(stack, seed, tmp_path, {"coordinator": [Slow()]}, names=["coordinator"])
        peer = await open_peer(stack, seed, "specialist_a")
        upward = new_message(
            MSG_COMMAND_REQUEST,
            source=a_id,
            target=coord_id,
            details={"command": "sleep", "params": {"seconds": 0}},
        )
        await peer.session.publish(topics.inbox(coord_id, a_id), serialize(upward))
        await wait_for(lambda: peer.of_type("command_error"))
        assert peer.of_type("command_error")[0].details["code"] == "UNAUTHORIZED_SOURCE"
        assert not peer.of_type("command_result")
