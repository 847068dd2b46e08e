"""A disk that jumps to 100 %: the alert still goes out, work goes elsewhere, nothing is lost."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, Slow, operator_config, start_agents, wait_for
from tests.kits.brokerkit import SEED_TREE, SecureBroker, tree_fleet
from tests.kits.diskkit import NEEDS_MOUNT, fill, small_tmpfs
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, VOXMessage, new_message, now_iso

pytestmark = [pytest.mark.slow, NEEDS_MOUNT]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB filesystem (tmpfs), mounted for the test and removed after it."""
    with small_tmpfs(tmp_path / "specialist_a") as mount:
        yield mount


def kick(secure: SecureBroker, name: str) -> None:
    """Connect once with an agent's own client id, so the broker drops its session."""
    creds = secure.creds(name)
    agent_id = secure.fleet.agent(name).id
    subprocess.run(
        [
            *("mosquitto_sub", "-h", "127.0.0.1", "-p", str(secure.dir.port), "-V", "5"),
            *("-u", creds.username, "-P", creds.password, "-i", creds.username),
            *("-t", topics.inbox_filter(agent_id), "-W", "1"),
        ],
        capture_output=True,
        timeout=20,
        check=False,
    )


def status_of(agent: VOXAgent, *, epoch: int, commands: list[str]) -> VOXMessage:
    """An in-bounds ACTIVE status of an agent, as its master would receive it."""
    assert agent.config.master_id is not None
    details = {
        "name": agent.name,
        "status": "ACTIVE",
        "epoch": epoch,
        "started_at": now_iso(),
        "heartbeat_interval": agent.config.heartbeat_interval,
        "commands": commands,
    }
    return new_message(
        MSG_AGENT_STATUS, source=agent.id, target=agent.config.master_id, details=details
    )


@pytest.fixture
def seed(secure_broker_factory: Any) -> SecureBroker:
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED_TREE))
    return broker


async def test_a_jump_to_a_full_disk_alerts_degrades_and_routes_elsewhere(
    seed: SecureBroker, small_disk: Path, tmp_path: Path
) -> None:
    fleet = seed.fleet
    a_id = fleet.agent("specialist_a").id
    roles = {"specialist_a": [Analyst()], "specialist_b": [Analyst(), Slow()]}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, seed, tmp_path, roles)
        root, coordinator, specialist = (
            agents["root"],
            agents["coordinator"],
            agents["specialist_a"],
        )
        assert specialist.config.state_dir == small_disk
        await wait_for(lambda: "analyze" in root.advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(seed, tmp_path)))
        epoch = specialist.epoch

        filler = fill(small_disk)

        # The alert goes out although nothing can be recorded: DISK_FULL, from the agent.
        def disk_full() -> list[Any]:
            return [i for i in root.incidents if i.failure.error_code == "DISK_FULL"]

        await wait_for(lambda: len(disk_full()) == 1, timeout=15)
        assert disk_full()[0].topic.source == a_id
        assert "disk_percent 100" in disk_full()[0].failure.description
        # Its status says it cannot record, and why; its master stops sending it work.
        entry = coordinator.fleet_view.get(a_id)
        assert entry is not None
        await wait_for(lambda: entry.status == "DEGRADED", timeout=15)
        assert entry.error_code == "LEDGER_UNAVAILABLE"
        assert not entry.healthy
        for n in range(3):
            reply = await operator.request("analyze", {"target": f"t{n}"}, to=fleet.root.id)
            assert reply.details["result"]["by"] == "specialist_b"
        # Sent to it all the same, a command gets a clear refusal, not silence.
        with pytest.raises(CommandFailed) as refused:
            await coordinator.request("analyze", {"target": "x"}, to=a_id, timeout=10)
        assert refused.value.code == "LEDGER_UNAVAILABLE"
        assert "cannot record" in refused.value.error
        # Dropped by the broker, it comes back although its epoch file cannot be written.
        kick(seed, "specialist_a")
        await wait_for(lambda: entry.epoch > epoch and entry.status == "DEGRADED", timeout=20)
        assert specialist.epoch == entry.epoch
        # A master that still believes it healthy (an in-bounds status newer than its real
        # ones, so they are ignored) sends it work: refused unrecorded, the work goes to the
        # other child. The other is made the busier one, so the first pick is the full one.
        forged = status_of(specialist, epoch=entry.epoch + 1, commands=["analyze"])
        coordinator.fleet_view.update(forged)
        assert entry.healthy
        busy = asyncio.ensure_future(
            operator.request("sleep", {"seconds": 2.0}, to=fleet.root.id, timeout=10)
        )
        await wait_for(lambda: coordinator.in_flight == 1)
        reply = await operator.request("analyze", {"target": "rerouted"}, to=fleet.root.id)
        assert reply.details["result"]["by"] == "specialist_b"
        await busy
        request_rows = [
            r
            for r in await coordinator.memory.get_recent(200)
            if r["action"] == "delegated" and r["details"].get("params") == {"target": "rerouted"}
        ]
        assert sorted(r["outcome"] for r in request_rows) == sorted(
            [str(a_id), str(fleet.agent("specialist_b").id)]
        )
        # Space comes back: it records again, says ACTIVE, and the incident is resolved.
        filler.unlink()
        kick(seed, "specialist_a")  # a new epoch, above the forged one
        await wait_for(lambda: entry.status == "ACTIVE" and entry.healthy, timeout=15)
        await wait_for(lambda: not disk_full(), timeout=15)
        await wait_for(lambda: "analyze" in coordinator.advertised_commands())
        assert (await specialist.memory.verify()).ok
