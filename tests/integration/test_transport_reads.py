"""Reading in large chunks: big and small messages in one burst arrive whole and in order."""

from __future__ import annotations

import asyncio
from uuid import uuid4

from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.transport.session import BrokerSettings, Session


def settings(port: int) -> BrokerSettings:
    return BrokerSettings(port=port, client_id=str(uuid4()), connect_timeout=5.0)


async def test_a_burst_of_big_and_small_messages_arrives_whole_and_in_order(
    plain_broker: LocalBroker,
) -> None:
    # Bigger than one read of the buffer (64 KiB), and many packets per read.
    payloads = [(bytes([65 + i % 26]) * (200_000 if i % 10 == 0 else 1 + i)) for i in range(120)]
    async with (
        asyncio.timeout(30),
        Session(settings(plain_broker.port), subscriptions=["t/burst"]) as sink,
        Session(settings(plain_broker.port), subscriptions=[]) as source,
    ):
        await asyncio.gather(*(source.publish("t/burst", p) for p in payloads))
        got = []
        async for message in sink.messages():
            got.append(message.payload)
            if len(got) == len(payloads):
                break
    assert [len(p) for p in got] == [len(p) for p in payloads]
    assert got == payloads
