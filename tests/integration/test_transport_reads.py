"""Reading in large chunks: big and small messages in one burst arrive whole and in order."""

from __future__ import annotations

import asyncio
import gc
import time
from uuid import uuid4

import paho.mqtt.client as mqtt
import pytest

from tests.kits import sessionkit
from tests.kits.sessionkit import Factory, conf
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


# Tiny retained messages: the broker writes them in milliseconds, reading them is seconds
# of Python, so the socket never runs dry while they are read.
BURST = 100_000


def retain_burst(port: int) -> None:
    """Publish BURST tiny retained messages with a raw paho client, the last acknowledged."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for n in range(BURST - 1):
            client.publish(f"b/{n}", b"x", qos=0, retain=True)
        client.publish(f"b/{BURST - 1}", b"x", qos=1, retain=True).wait_for_publish(timeout=60)
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.slow
async def test_a_burst_that_keeps_the_socket_full_leaves_the_event_loop_its_turns(
    broker_factory: Factory,
) -> None:
    broker = broker_factory(conf("allow_anonymous true", f"max_queued_messages {2 * BURST}"))
    await asyncio.to_thread(retain_burst, broker.port)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    taken = 0
    session = Session(
        sessionkit.settings(broker.port), subscriptions=["b/#"], mark_retained_end=True
    )

    async def take() -> None:
        nonlocal taken
        async for _ in session.messages():
            taken += 1

    # The collector's own pauses grow with what is alive (up to 0.7 s here): they are not
    # what this test is about, so it runs only afterwards.
    gc.disable()
    try:
        async with session:
            ticker, reader = asyncio.ensure_future(tick()), asyncio.ensure_future(take())
            try:
                assert await session.caught_up(120)
            finally:
                ticker.cancel()
                reader.cancel()
    finally:
        gc.enable()
    assert taken == BURST
    # A read of everything the socket held in one go kept timers and tasks waiting for
    # 3.5 s here (19 s on a starved machine); a turn now reads at most 256 packets.
    assert max(gaps) < 0.5, f"the event loop waited {max(gaps):.2f}s"
