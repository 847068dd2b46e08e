"""Seed 000's flow through real agents on a real, ACL-secured broker."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, Slow, agent_config, operator_config, start_agents, wait_for
from tests.kits.brokerkit import SEED_TREE, seven_agent_fleet, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.protocol.errors import CommandFailed


@pytest.fixture
def seed_fleet():  # type: ignore[no-untyped-def]
    return tree_fleet(SEED_TREE)


async def test_command_goes_down_the_tree_and_the_result_comes_back(
    secure_broker_factory: Any, seed_fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(seed_fleet)
    roles = {"specialist_a": [Analyst()], "specialist_b": [Analyst()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, roles)
        root, coordinator = agents["root"], agents["coordinator"]
        await wait_for(lambda: "analyze" in root.advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        reply = await operator.request(
            "analyze", {"target": "invoice.pdf"}, to=seed_fleet.root.id, timeout=10
        )
        assert reply.type == "command_result"
        assert reply.details["result"]["target"] == "invoice.pdf"
        assert reply.details["handled_by"] == str(root.id)
        # The root's ledger names the coordinator and never a specialist.
        root_rows = await root.memory.get_recent(200)
        specialists = {str(seed_fleet.agent(n).id) for n in ("specialist_a", "specialist_b")}
        seen_by_root = {r.get("source") for r in root_rows} | {r.get("target") for r in root_rows}
        assert not (seen_by_root & specialists)
        assert str(coordinator.id) in seen_by_root
        chain = await root.memory.trace(reply.message_id)
        assert len(chain) >= 2


async def test_unknown_command_is_no_route(
    secure_broker_factory: Any, seed_fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(seed_fleet)
    async with AsyncExitStack() as stack:
        await start_agents(stack, secure, tmp_path, {})
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        with pytest.raises(CommandFailed) as failure:
            await operator.request("nothing", {}, to=seed_fleet.root.id, timeout=10)
        assert failure.value.code == "NO_ROUTE"


async def test_handler_errors_and_bad_params_are_command_errors(
    secure_broker_factory: Any, seed_fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(seed_fleet)
    async with AsyncExitStack() as stack:
        await start_agents(stack, secure, tmp_path, {"root": [Slow()]}, names=["root"])
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        root_id = seed_fleet.root.id
        with pytest.raises(CommandFailed) as failure:
            await operator.request("boom", {}, to=root_id, timeout=10)
        assert failure.value.code == "HANDLER_ERROR"
        assert "exploded on purpose" in failure.value.error
        with pytest.raises(CommandFailed) as failure:
            await operator.request("sleep", {"seconds": "long"}, to=root_id, timeout=10)
        assert failure.value.code == "INVALID_PARAMS"
        assert failure.value.error.startswith("parameter 'seconds' should be a valid number")
        reply = await operator.request("sleep", {"seconds": 0.01}, to=root_id, timeout=10)
        assert reply.details["result"] == 0.01


async def test_seven_agents_route_to_the_right_branch(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = seven_agent_fleet()
    secure = secure_broker_factory(fleet)
    leaves = [a.name for a in fleet if not fleet.children_of(a.id)]
    roles = {leaves[0]: [Analyst()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, roles)
        await wait_for(lambda: "analyze" in agents[fleet.root.name].advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        reply = await operator.request("analyze", {"target": "x"}, to=fleet.root.id, timeout=10)
        assert reply.details["result"]["by"] == leaves[0]


async def test_commands_reach_the_root_as_soon_as_a_grandchild_appears(
    secure_broker_factory: Any, seed_fleet: Any, tmp_path: Path
) -> None:
    """Masters first, leaves last, slow heartbeats: the advertisement still climbs at once."""
    secure = secure_broker_factory(seed_fleet)
    async with AsyncExitStack() as stack:
        agents: dict[str, VOXAgent] = {}
        for name in ("root", "coordinator", "specialist_a"):
            roles = [Analyst()] if name == "specialist_a" else []
            config = agent_config(secure, name, tmp_path, heartbeat_interval=60.0)
            agents[name] = await stack.enter_async_context(VOXAgent(config, roles))
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))

        def root_says_analyze() -> bool:
            seen = operator.fleet_view.get(seed_fleet.root.id)
            return seen is not None and "analyze" in seen.commands

        # What the root publishes, not what it knows: the operator's view of its status.
        await wait_for(root_says_analyze, timeout=5)


async def test_a_delegated_command_carries_what_arrived_from_its_origin(
    secure_broker_factory: Any, seed_fleet: Any, tmp_path: Path
) -> None:
    # Seed 003: message_source is the origin's (an e-mail address, a console), and a message
    # is not modified on its way: each level's request carries the details it was sent.
    secure = secure_broker_factory(seed_fleet)
    roles = {"specialist_a": [Analyst()], "specialist_b": [Analyst()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, roles)
        seen = []
        for name in ("coordinator", "specialist_a", "specialist_b"):
            agents[name].listeners.append(seen.append)
        await wait_for(lambda: "analyze" in agents["root"].advertised_commands())
        config = operator_config(secure, tmp_path, message_source="ana@netwire.example")
        operator = await stack.enter_async_context(VOXAgent(config))
        await operator.request("analyze", {"target": "invoice.pdf"}, to=seed_fleet.root.id)
        commands = [m for m in seen if m.type == "command_request"]
        assert len(commands) == 2  # at the coordinator, then at one specialist
        for command in commands:
            assert command.message_source == "ana@netwire.example"
            assert command.details["command"] == "analyze"
            assert command.details["params"] == {"target": "invoice.pdf"}
