"""The agent's pure decisions: which inbound message it accepts, which child serves a command."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from uuid import UUID

from vox_mqtt.observe.status import AgentLiveness
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, ErrorCode, VOXMessage
from vox_mqtt.protocol.topics import InboxTopic

__all__ = ["choose_child", "verify"]


def verify(
    message: VOXMessage,
    topic: InboxTopic,
    *,
    me: UUID,
    master_id: UUID | None,
    peers: frozenset[UUID],
) -> str | None:
    """Return why a message may not be accepted, or None (docs/topics.md)."""
    if topic.target != me:
        return f"arrived on another agent's inbox ({topic.target})"
    if message.source != topic.source:
        return f"source {message.source} does not match the sender {topic.source}"
    if message.target != me:
        return f"target {message.target} is not this agent"
    if message.source not in peers:
        return f"{message.source} is neither this agent's master nor a child"
    if message.type == MSG_COMMAND_REQUEST and message.source != master_id:
        # Commands only flow down the tree; a child may report, never command.
        return "command_request from a child: commands come only from the master"
    return None


def choose_child(
    command: str,
    children: Iterable[AgentLiveness | None],
    *,
    load: Mapping[UUID, int],
    tiebreak: Callable[[], float] = random.random,
) -> tuple[UUID | None, ErrorCode | None]:
    """Pick a child for a command: healthy first, then least busy; else an error code."""
    advertising = [c for c in children if c is not None and command in c.commands]
    healthy = [c for c in advertising if c.healthy]
    if healthy:
        best = min(healthy, key=lambda c: (load.get(c.id, 0), tiebreak()))
        return best.id, None
    return None, ErrorCode.TARGET_INACTIVE if advertising else ErrorCode.NO_ROUTE
