"""What the parts of one agent share: config, ledger, tracker, metrics, session and tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.publishprops import PublishProperties
from vox_mqtt.transport.session import Session

__all__ = ["AgentContext", "TaskSet"]

log = logging.getLogger("vox_mqtt.agent")


class TaskSet:
    """The background tasks of one agent: named, logged when they fail, cancelled together."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Run a coroutine in the background under this agent's name."""
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.owner}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed: %r", self.owner, task.get_name(), task.exception())

    async def cancel_all(self, timeout: float = 5.0) -> None:
        """Cancel every task still running and wait up to timeout for them to end."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)


@dataclass(kw_only=True, eq=False)
class AgentContext:
    """The few things every part of an agent is handed; each part keeps its own state."""

    config: AgentConfig
    ledger: VOXAgentMemory
    tracker: RequestTracker
    tasks: TaskSet
    session: Session  # built with the agent, connected while it runs
    # Every part counts its own work here; the heartbeat carries the snapshot.
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    # What agents below served while ACTIVE and none ACTIVE serves now: the status carries it
    # (`commands_down`), so its master answers TARGET_INACTIVE for them (docs/liveness.md).
    commands_down: Callable[[], list[str]] = list
    # What an MQTT explorer shows beside each publish, built once per peer and type.
    publish_props: PublishProperties = field(init=False)

    def __post_init__(self) -> None:
        known = dict(self.config.children)
        if self.config.master_id is not None:
            known[self.config.master_id] = self.config.master_name
        self.publish_props = PublishProperties(self.config.name, known)

    @property
    def id(self) -> UUID:
        """Return this agent's id."""
        return self.config.id

    @property
    def name(self) -> str:
        """Return this agent's name."""
        return self.config.name
