"""The VOX side of figures 1-3: in-process agents of the seed tree and the operator.

bench/deployed.py runs the same agents each in its own `vox-agent` process instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from typing import Any

from bench.common import BenchBroker
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command


class Ping(Role):
    """The root's own trivial command (figure 1): pure, so declared idempotent, as a user would."""

    @command(idempotent=True)
    async def ping(self, text: str = "") -> dict[str, Any]:
        return {"text": text}


class Echo(Role):
    """A specialist's trivial command (figures 2 and 3): pure, so declared idempotent."""

    @command(idempotent=True)
    async def echo(self, text: str = "") -> dict[str, Any]:
        return {"text": text}


LEDGER_SYNC_ENV = "VOX_BENCH_LEDGER_SYNC"

# Who serves what: the root answers `ping` itself and delegates `echo` down the tree.
SEED_ROLES: dict[str, tuple[type[Role], ...]] = {
    "root": (Ping,),
    "spec_a": (Echo,),
    "spec_b": (Echo,),
}


def seed_role_specs() -> dict[str, list[str]]:
    """Return SEED_ROLES as a fleet file names them ("bench.voxside:Ping"), for the daemons."""
    return {
        name: [f"{cls.__module__}:{cls.__qualname__}" for cls in classes]
        for name, classes in SEED_ROLES.items()
    }


async def start_vox(
    stack: AsyncExitStack,
    bench: BenchBroker,
    names: Iterable[str],
    roles: Mapping[str, tuple[type[Role], ...]] = SEED_ROLES,
    **overrides: Any,
) -> tuple[VOXAgent, dict[str, VOXAgent]]:
    """Start the named agents leaves first, then the operator; wait until routes are known."""
    fleet = bench.fleet
    # `python -m bench --ledger-sync normal` measures the other durability setting.
    overrides.setdefault("ledger_sync", os.environ.get(LEDGER_SYNC_ENV, "full"))
    chosen = sorted(names, key=lambda n: -fleet.depth_of(fleet.agent(n).id))
    agents: dict[str, VOXAgent] = {}
    for name in chosen:
        agent = VOXAgent(bench.agent_config(name, **overrides), [r() for r in roles.get(name, ())])
        agents[name] = await stack.enter_async_context(agent)
    operator = await stack.enter_async_context(VOXAgent(bench.operator_config(**overrides)))
    # The root must have learned its children's advertised commands (retained status).
    wanted = {c for n in chosen for c in agents[n].commands}
    async with asyncio.timeout(30):
        while not wanted <= set(agents[fleet.root.name].advertised_commands()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return operator, agents
