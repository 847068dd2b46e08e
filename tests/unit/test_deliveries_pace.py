"""Deliveries: the pace of re-sending after a reconnection and after a peer is back.

A connection back up tries every delivery at once and each keeps its pace: an acknowledged
request waiting for its answer stays at the slowest (agent/deliveries.py, `patient`). A
peer seen ACTIVE again restarts its deliveries' pace (docs/messages.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from uuid import uuid4

from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.deliveries import Deliveries
from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, new_message, serialize
from vox_mqtt.protocol.settings import AgentConfig, BrokerSettings
from vox_mqtt.transport.outcome import PublishOutcome
from vox_mqtt.transport.publishprops import PublishProperties

ME, CHILD = uuid4(), uuid4()


class Offline:
    """A publisher with no connection up: `publish_soon` says so (agent/ports.py)."""

    async def publish(self, topic: str, payload: bytes, **options: Any) -> None:
        raise AssertionError("deliveries publish without waiting")

    def publish_soon(
        self, topic: str, payload: bytes, **options: Any
    ) -> asyncio.Future[PublishOutcome] | None:
        return None


async def test_a_reconnection_keeps_a_patient_request_patient_a_peer_back_does_not(
    tmp_path: Path,
) -> None:
    config = AgentConfig(
        id=ME,
        name="coord",
        master_id=uuid4(),
        children={CHILD: "spec"},
        state_dir=tmp_path,
        broker=BrokerSettings(host="127.0.0.1", port=1883, client_id="coord"),
    )
    tracker = RequestTracker()
    async with VOXAgentMemory(tmp_path / "logs.db") as ledger:
        deliveries = Deliveries(
            settings=lambda: config,
            ledger=ledger,
            publisher=Offline(),
            tracker=tracker,
            metrics=AgentMetrics(),
            tasks=TaskSet("coord"),
            props=PublishProperties("coord", dict(config.children)),
        )
        request = new_message(
            MSG_COMMAND_REQUEST, source=ME, target=CHILD, details={"command": "analyze"}
        )
        tracked = tracker.track(request, expects_reply=True)
        deliveries.start(tracked, serialize(request), resend=False)
        tracker.acknowledged(request.message_id, by=CHILD)
        deliveries.patient(tracked)  # its child holds it: re-sent only lest its answer be lost
        assert tracked.delivery is not None
        slowest = config.resend_max * 0.8  # the pace's jitter is 0.8-1.2
        assert tracked.delivery.delay >= slowest
        deliveries.reconnected()
        assert tracked.delivery.delay >= slowest  # the same pace after the try
        deliveries.heard_from(CHILD, back=True)
        assert tracked.delivery.delay <= config.resend_initial * 2 * 1.2  # from the start
        deliveries.close()
