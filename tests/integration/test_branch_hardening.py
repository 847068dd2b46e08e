"""One child cannot take down its branch: an inflated status, an oversized result."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, agent_config, operator_config, start_agents, wait_for
from tests.kits.brokerkit import (
    SEED_TREE,
    SecureBroker,
    inflated_status,
    publish_as_identity,
    tree_fleet,
)
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.cli import main
from vox_mqtt.ledger._schema import _TRIGGER_SQL
from vox_mqtt.observe.status import ACTIVE
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import serialize

pytestmark = pytest.mark.slow


class Huge(Analyst):
    """A specialist that answers with as many 1e15 numbers as it is asked for."""

    @command
    async def numbers(self, count: int) -> list[float]:
        return [1e15] * count


@pytest.fixture
def seed(secure_broker_factory: Any) -> SecureBroker:
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED_TREE))
    return broker


def publish_as(secure: SecureBroker, name: str, topic: str, payload: bytes, tmp: Path) -> None:
    """Publish one retained message with an agent's credentials, as an attacker holding them."""
    creds = secure.creds(name)
    publish_as_identity(
        port=secure.dir.port,
        username=creds.username,
        password=creds.password,
        topic=topic,
        payload=payload,
        tmp=tmp,
    )


async def test_an_inflated_child_status_leaves_the_branch_serving(
    seed: SecureBroker, tmp_path: Path
) -> None:
    fleet = seed.fleet
    coord_id = fleet.agent("coordinator").id
    a_id, b_id = fleet.agent("specialist_a").id, fleet.agent("specialist_b").id
    roles = {"specialist_a": [Analyst()], "specialist_b": [Analyst()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, roles)
        root, coordinator = agents["root"], agents["coordinator"]
        await wait_for(lambda: "analyze" in root.advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(seed, tmp_path)))

        publish_as(
            seed,
            "specialist_a",
            topics.status(a_id),
            inflated_status(seed.fleet, "specialist_a"),
            tmp_path,
        )

        # The root keeps the coordinator ACTIVE across many of its heartbeat intervals,
        # and its advertisement stays small: only what the healthy child offers.
        watched_until = time.monotonic() + 6 * coordinator.config.heartbeat_interval
        while time.monotonic() < watched_until:
            seen = root.fleet_view.get(coord_id)
            assert seen is not None
            assert seen.status == ACTIVE, seen
            await asyncio.sleep(0.2)
        assert coordinator.advertised_commands() == ["analyze"]
        # The coordinator refused the status, with the reasons, and never believed it.
        entry = coordinator.fleet_view.get(a_id)
        assert entry is not None
        assert entry.rejected is not None
        assert "commands" in entry.rejected
        assert "heartbeat_interval" in entry.rejected
        assert entry.epoch < 1000
        # Commands go to the other child while the misbehaving one is held.
        for n in range(4):
            reply = await operator.request(
                "analyze", {"target": f"t{n}"}, to=fleet.root.id, timeout=10
            )
            assert reply.details["result"]["by"] == "specialist_b"
        # One war-room incident, from the coordinator, about the misbehaving child.
        await wait_for(lambda: [i for i in root.incidents if i.failure.subject == a_id])
        posts = [i for i in root.incidents if i.failure.subject == a_id]
        assert len(posts) == 1
        assert posts[0].failure.error_code == "CHILD_MISBEHAVING"
        assert posts[0].topic.source == coord_id
        assert b_id not in {i.failure.subject for i in root.incidents}


async def test_an_oversized_result_is_a_clear_command_error_not_a_disconnect(
    seed: SecureBroker, tmp_path: Path
) -> None:
    fleet = seed.fleet
    roles = {"specialist_a": [Huge()]}
    names = ["root", "coordinator", "specialist_a"]
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, roles, names)
        root = agents["root"]
        await wait_for(lambda: "numbers" in root.advertised_commands())
        epochs = {name: agent.epoch for name, agent in agents.items()}
        operator = await stack.enter_async_context(VOXAgent(operator_config(seed, tmp_path)))
        started = time.monotonic()
        with pytest.raises(CommandFailed) as failure:
            await operator.request("numbers", {"count": 30_000}, to=fleet.root.id, timeout=20)
        assert failure.value.code == "MESSAGE_TOO_LARGE"
        assert "the result of 'numbers' is too large to send" in failure.value.error
        assert "over the 262144-byte message limit" in failure.value.error
        assert time.monotonic() - started < 10  # an answer, not a timeout
        # A result that fits still comes back whole, as integers, through the coordinator.
        reply = await operator.request("numbers", {"count": 1000}, to=fleet.root.id, timeout=10)
        assert reply.details["result"] == [10**15] * 1000
        assert b"1000000000000000.0" not in serialize(reply)
        # Nobody was disconnected: every agent is still on its first connection.
        assert {name: agent.epoch for name, agent in agents.items()} == epochs
        assert not root.incidents
        rows = await agents["specialist_a"].memory.get_recent(50)
        errors = [r for r in rows if r["message_type"] == "command_error" and r["action"] == "sent"]
        assert [json.loads(json.dumps(r["details"]))["code"] for r in errors] == [
            "MESSAGE_TOO_LARGE"
        ]
        # Its record ends as its ledger row says, `failed`, not as the result it replaced.
        ended = [r["action"] for r in rows if r["action"] in ("completed", "failed")]
        assert ended == ["completed", "failed"]  # newest first: the 1,000 after the 30,000
        await wait_for(lambda: agents["specialist_a"].metrics.requests_ended.values)
        assert dict(agents["specialist_a"].metrics.requests_ended.values) == {
            "failed": 1,
            "completed": 1,
        }


class Watchdog(Role):
    """A role that raises its own war-room incident and resolves it."""

    @command
    async def trouble(self, on: bool) -> bool:
        if on:
            return await self.agent.raise_incident("QUEUE_BACKLOG", "the backlog is 900 jobs")
        return await self.agent.resolve_incident("QUEUE_BACKLOG", "the backlog is cleared")


async def test_a_role_raises_and_resolves_its_own_incident_once(
    seed: SecureBroker, tmp_path: Path
) -> None:
    fleet = seed.fleet
    watchdog = Watchdog()
    names = ["root", "coordinator", "specialist_a"]
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {"specialist_a": [watchdog]}, names)
        root = agents["root"]
        await wait_for(lambda: "trouble" in root.advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(seed, tmp_path)))

        async def trouble(on: bool) -> bool:
            reply = await operator.request("trouble", {"on": on}, to=fleet.root.id, timeout=10)
            return bool(reply.details["result"])

        def posts() -> list[Any]:
            return [i for i in root.incidents if i.failure.error_code == "QUEUE_BACKLOG"]

        assert await trouble(True)
        assert not await trouble(True)  # one post per incident, however often it is raised
        await wait_for(lambda: len(posts()) == 1)
        [post] = posts()
        a_id = fleet.agent("specialist_a").id
        assert post.topic.source == a_id
        assert post.failure.subject == a_id  # the one topic an agent may post about itself
        assert post.failure.description == "specialist_a: the backlog is 900 jobs"
        assert post.failure.severity == "ERROR"
        assert await trouble(False)
        await wait_for(lambda: not posts())
        assert not await trouble(False)
        with pytest.raises(ValueError, match="UPPER_SNAKE_CASE"):
            await agents["specialist_a"].raise_incident("not a code", "x")


async def test_a_handler_added_after_mounting_is_routed(seed: SecureBroker, tmp_path: Path) -> None:
    fleet = seed.fleet
    role = Analyst()
    seen: list[str] = []
    names = ["coordinator", "specialist_a"]
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {"coordinator": [role]}, names)
        coordinator = agents["coordinator"]

        @role.on("job_detected")
        async def job(message: Any) -> None:
            seen.append(str(message.message_id))

        assert "job_detected" in coordinator.events
        tracked = await agents["specialist_a"].notify_master(
            "job_detected",
            {
                "start_time": "2026-01-12T09:00:00+00:00",
                "end_time": "2026-01-12T10:00:00+00:00",
                "estimated_effort_minutes": 30,
                "price": {"currency": "USD", "value": 10},
            },
        )
        await wait_for(lambda: seen == [str(tracked.message_id)])
        with pytest.raises(ValueError, match="is a command"):
            role.on("analyze")
    assert fleet.agent("coordinator").id == coordinator.id


async def test_heartbeats_carry_the_ledger_head_and_the_master_catches_a_truncation(
    seed: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = seed.fleet
    a_id = fleet.agent("specialist_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, {}, ["root", "coordinator"])
        coordinator = agents["coordinator"]
        async with VOXAgent(agent_config(seed, "specialist_a", tmp_path), [Analyst()]) as a:
            await wait_for(lambda: "analyze" in coordinator.advertised_commands())
            for n in range(3):
                await coordinator.request("analyze", {"target": f"t{n}"}, to=a_id, timeout=10)
            row = (await a.memory.head())[0]
            entry = coordinator.fleet_view.get(a_id)
            assert entry is not None
            await wait_for(lambda: (entry.ledger_head or (0, ""))[0] >= row)
        # Stopped: its SHUTDOWN status carried its last head, which the master marks final.
        await wait_for(lambda: entry.error_code == "SHUTDOWN")
        witnessed = await coordinator.memory.witnessed_heads(a_id)
        assert witnessed[-1]["details"]["final"] is True
        assert len(witnessed) >= 2
    child_db, master_db = (
        tmp_path / "specialist_a" / "logs.db",
        tmp_path / "coordinator" / "logs.db",
    )
    args = ["ledger", str(child_db), "verify", "--witness", str(master_db)]
    capsys.readouterr()
    assert await asyncio.to_thread(main, args) == 0
    assert f"witnessed of agent {a_id}" in capsys.readouterr().out
    # Someone with the file drops the newest rows and puts the triggers back: the chain
    # verifies on its own, the master's record does not.
    with sqlite3.connect(child_db) as db:
        last = db.execute("SELECT MAX(id) FROM logs").fetchone()[0]
        for name in _TRIGGER_SQL:
            db.execute(f"DROP TRIGGER {name}")
        db.execute("DELETE FROM logs WHERE id > ?", (last - 3,))
        for sql in _TRIGGER_SQL.values():
            db.execute(sql)
    assert await asyncio.to_thread(main, ["ledger", str(child_db), "verify"]) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, args) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert f"it ends at row {last - 3}: rows were removed since row" in err
