"""The seed fleet on a real broker for `vox` CLI tests: its configs, its agents, a `vox` runner."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, start_agents, wait_for
from tests.kits.brokerkit import SecureBroker, tree_fleet
from vox_mqtt.cli import main
from vox_mqtt.fleet.bundles import render_agent_config

SEED = {"root": None, "coordinator": "root", "spec_a": "coordinator", "spec_b": "coordinator"}
ROLES = {"spec_a": [Analyst()], "spec_b": [Analyst()]}


@pytest.fixture
def secure(secure_broker_factory: Any, request: pytest.FixtureRequest) -> SecureBroker:
    """The fleet's broker; client ids locked unless a test asks (indirect param False)."""
    locked = getattr(request, "param", True)
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED), lock_client_ids=locked)
    return broker


@pytest.fixture
def configs(secure: SecureBroker, tmp_path: Path) -> dict[str, Path]:
    """Rendered configs: the operator's and each agent's (used by the CLI only)."""
    out = {}
    for name in ("operator", *SEED):
        rendered = render_agent_config(
            secure.fleet,
            name,
            secure.dir.root,
            tmp_path / "etc" / f"{name}.toml",
            tmp_path / "cli-state" / name,
        )
        out[name] = rendered.config
    return out


@pytest.fixture
def capture(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `vox ARGS` in a worker thread (it runs its own event loop); return code, out, err."""

    async def run(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, [str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def running_fleet(stack: AsyncExitStack, secure: SecureBroker, tmp_path: Path) -> Any:
    agents = await start_agents(stack, secure, tmp_path, ROLES, heartbeat_interval=1.0)
    await wait_for(lambda: "analyze" in agents["root"].advertised_commands())
    return agents
