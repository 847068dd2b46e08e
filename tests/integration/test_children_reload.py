"""A running master takes new children and lets old ones go without reconnecting."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, Slow, operator_config, start_agents, wait_for
from tests.kits.brokerkit import reload_broker, rerender, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed

TREE = {"root": None, "coordinator": "root", "spec_a": "coordinator", "spec_b": "coordinator"}


async def test_children_come_and_go_without_a_reconnect(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = tree_fleet(TREE)
    secure = secure_broker_factory(fleet)
    spec_a, spec_b = fleet.agent("spec_a").id, fleet.agent("spec_b").id
    roles = {"spec_a": [Analyst()], "spec_b": [Slow()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, roles)
        coord, root = agents["coordinator"], agents["root"]
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        await wait_for(lambda: root.advertised_commands() == ["analyze", "boom", "sleep"])
        assert coord.session is not None
        connections = coord.session.connection_count

        # spec_b leaves while a request delegated to it is running: that request is
        # answered at once, the others keep going.
        slow = asyncio.ensure_future(
            operator.request("sleep", {"seconds": 20}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: any(t.message.target == spec_b for t in coord.tracker.pending()))
        down = next(t for t in coord.tracker.pending() if t.message.target == spec_b)
        change = await coord.update_children({spec_a: "spec_a"})
        assert change == "children -spec_b"
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(slow, 5)
        assert failed.value.code == "TARGET_INACTIVE"
        assert "spec_b is no longer a child of coordinator" in failed.value.error
        # Its end is durable, as every end is: a "failed" row, and nothing left to re-send.
        rows = await coord.ledger.find(down.message_id)
        assert [(r["action"], r["outcome"]) for r in rows if r["action"] == "failed"] == [
            ("failed", "TARGET_INACTIVE")
        ]
        assert all(m != str(down.message_id) for m, _, _ in await coord.ledger.pending_outbox())
        assert coord.advertised_commands() == ["analyze"]
        await wait_for(lambda: root.advertised_commands() == ["analyze"])
        assert topics.status(spec_b) not in coord.session.subscriptions
        reply = await operator.request("analyze", {"target": "x"}, to=fleet.root.id, timeout=10)
        assert reply.details["result"]["by"] == "spec_a"

        # ...and comes back: watched, advertised and routed to again.
        change = await coord.update_children({spec_a: "spec_a", spec_b: "spec_b"})
        assert change == "children +spec_b"
        await wait_for(lambda: root.advertised_commands() == ["analyze", "boom", "sleep"])
        reply = await operator.request("sleep", {"seconds": 0.1}, to=fleet.root.id, timeout=10)
        assert reply.details["result"] == 0.1

        # A rename is a name only.
        assert await coord.update_children({spec_a: "analyst", spec_b: "spec_b"}) == (
            "children spec_a->analyst"
        )
        assert coord.session.connection_count == connections


async def test_a_new_secret_is_taken_for_the_next_connection_and_refusals_cost_no_epoch(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = tree_fleet(TREE)
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, ["coordinator", "spec_a"])
        spec = agents["spec_a"]
        assert spec.session is not None
        epoch = spec.epoch
        # Re-keyed at the broker before the agent is told: it is cut off and refused.
        rerender(secure, fleet, rotate=("spec_a",))
        assert await asyncio.to_thread(reload_broker, secure) == 0
        await wait_for(lambda: not spec.session.connected)  # type: ignore[union-attr]
        await asyncio.sleep(2.0)  # several refused attempts
        assert "not authorised" in secure.broker.log_text()
        # Told, it logs in with the new secret: one new epoch, whatever was refused before.
        spec.update_secret(secure.creds("spec_a").password)
        await wait_for(lambda: spec.session.connected, timeout=40)  # type: ignore[union-attr]
        assert spec.epoch == epoch + 1
