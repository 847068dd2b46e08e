"""Run agents of a rendered fleet in this process, for runtime tests on a real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from tests.kits.brokerkit import SecureBroker
from vox_mqtt.agent.facade import AgentConfig, VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.fleet.bundles import fleet_agent_config, fleet_operator_config
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import VOXMessage, parse
from vox_mqtt.protocol.topics import STATUS_FILTER, WARROOM_FILTER
from vox_mqtt.transport.session import BrokerSettings, Session


class Analyst(Role):
    """A specialist's command for seed 000's flow."""

    @command
    async def analyze(self, target: str) -> dict[str, Any]:
        return {"target": target, "findings": len(target), "by": self.agent.name}


class Slow(Role):
    """A command that takes as long as it is told."""

    @command
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @command
    async def boom(self) -> None:
        raise RuntimeError("exploded on purpose")


def settings_for(secure: SecureBroker, name: str, **overrides: Any) -> BrokerSettings:
    """Return transport settings that log in as the named identity."""
    creds = secure.creds(name)
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": secure.dir.port,
        "username": creds.username,
        "password": creds.password,
        "client_id": creds.username,
        "keepalive": 5,
    }
    values.update(overrides)
    return BrokerSettings(**values)


def agent_config(
    secure: SecureBroker, name: str, state_root: Path, **overrides: Any
) -> AgentConfig:
    """Return the runtime config of one agent of the fleet: only its own slice."""
    values: dict[str, Any] = {"heartbeat_interval": 1.0, "request_timeout": 10.0}
    values["resend_initial"] = 0.3
    values.update(overrides)
    return fleet_agent_config(
        secure.fleet,
        name,
        broker=settings_for(secure, name),
        state_dir=state_root / name,
        **values,
    )


def operator_config(secure: SecureBroker, state_root: Path, **overrides: Any) -> AgentConfig:
    """Return the operator console's config: the root's master, publishing no status."""
    fleet = secure.fleet
    values: dict[str, Any] = {"request_timeout": 10.0, "resend_initial": 0.3}
    values["observe"] = (STATUS_FILTER, WARROOM_FILTER)
    values.update(overrides)
    return fleet_operator_config(
        fleet,
        broker=settings_for(secure, fleet.operator_name),
        state_dir=state_root / fleet.operator_name,
        **values,
    )


async def start_agents(
    stack: AsyncExitStack,
    secure: SecureBroker,
    state_root: Path,
    roles: Mapping[str, Iterable[Role]],
    names: Iterable[str] | None = None,
    **overrides: Any,
) -> dict[str, VOXAgent]:
    """Start agents leaves first, so masters learn their children's commands at once."""
    fleet = secure.fleet
    chosen = list(names) if names is not None else [a.name for a in fleet]
    chosen.sort(key=lambda n: -fleet.depth_of(fleet.agent(n).id))
    agents: dict[str, VOXAgent] = {}
    for name in chosen:
        agent = VOXAgent(agent_config(secure, name, state_root, **overrides), roles.get(name, ()))
        agents[name] = await stack.enter_async_context(agent)
    return agents


async def start_tree_with_operator(
    stack: AsyncExitStack,
    secure: SecureBroker,
    state_root: Path,
    roles: Mapping[str, Iterable[Role]],
    *,
    ready: str,
    operator: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> tuple[dict[str, VOXAgent], VOXAgent]:
    """Start the fleet's agents with their roles, wait until the root offers the command
    `ready`, then start the operator console (`operator`: its own config overrides)."""
    agents = await start_agents(stack, secure, state_root, roles, **overrides)
    root = secure.fleet.root.name
    await wait_for(lambda: ready in agents[root].advertised_commands())
    console = VOXAgent(operator_config(secure, state_root, **(operator or {})))
    return agents, await stack.enter_async_context(console)


async def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll predicate() until true; fail the test after timeout seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling state another task mutates
            await asyncio.sleep(interval)


JOB = {
    "start_time": "2026-01-11T08:15:00-03:00",
    "end_time": "2026-01-11T16:00:00-03:00",
    "estimated_effort_minutes": 60,
    "price": {"currency": "USD", "value": 30},
    "note_to_human": "Client: Netwire",
}


class Peer:
    """A raw session under a peer's identity, collecting what arrives in its inbox."""

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = name
        self.received: list[VOXMessage] = []
        self._task: asyncio.Task[None] | None = None

    async def pump(self) -> None:
        async for inbound in self.session.messages():
            self.received.append(parse(inbound.payload))

    def of_type(self, kind: str) -> list[VOXMessage]:
        return [m for m in self.received if m.type == kind]


async def open_peer(stack: AsyncExitStack, secure: Any, name: str) -> Peer:
    agent_id = secure.fleet.agent(name).id
    session = await stack.enter_async_context(
        Session(settings_for(secure, name), subscriptions=[topics.inbox_filter(agent_id)])
    )
    peer = Peer(session, name)
    task = asyncio.ensure_future(peer.pump())
    stack.callback(task.cancel)
    return peer


class Tally(Role):
    """Count executions in a file, one line per run, to prove nothing runs twice."""

    @command
    async def tally(self, n: int, seconds: float = 0.0) -> int:
        path = self.settings["tally_file"]
        await asyncio.sleep(seconds)
        await asyncio.to_thread(_append_line, path, f"{n}\n")
        return n


def _append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
