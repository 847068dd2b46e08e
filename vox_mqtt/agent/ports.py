"""The small interfaces the agent core's parts are built with: a ledger and a publisher.

`ledger.VOXAgentMemory` and `transport.Session` are what a running agent hands them; a part
names the interface it needs, not the whole agent (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from uuid import UUID

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.messages import VOXMessage
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.outcome import PublishOutcome

__all__ = ["Publisher", "Recorder", "Settings"]

Settings = Callable[[], AgentConfig]  # the agent's config as it is now (a reload replaces it)


class Recorder(Protocol):
    """Where a part records what it sends (the agent's ledger)."""

    async def record_message(
        self,
        message: VOXMessage,
        action: LedgerAction,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        topic: str | None = None,
        outbox: tuple[str, bytes] | None = None,
        outbox_for: VOXMessage | None = None,
        outbox_done: UUID | None = None,
        replay_until: float | None = None,
        then: Iterable[tuple[VOXMessage, LedgerAction, str | None]] = (),
    ) -> int:
        """Record a message under an action; see VOXAgentMemory.record_message."""
        ...


class Publisher(Protocol):
    """How a part puts bytes on the broker (the agent's MQTT session)."""

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        expiry: int | None = None,
        content_type: str | None = "application/json",
        props: Any = None,
    ) -> None:
        """Return once the broker accepted the message; raise DeliveryFailed otherwise."""
        ...

    def publish_soon(
        self,
        topic: str,
        payload: bytes,
        *,
        content_type: str | None = "application/json",
        props: Any = None,
    ) -> asyncio.Future[PublishOutcome] | None:
        """Publish on the live connection without waiting; None when no connection is up.

        The future resolves to the publish's outcome (transport/outcome.py), never raises."""
        ...
