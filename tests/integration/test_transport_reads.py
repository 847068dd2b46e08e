"""Reading in large chunks: big and small messages in one burst arrive whole and in order."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import paho.mqtt.client as mqtt
import pytest

from tests.kits import sessionkit
from tests.kits.sessionkit import Factory, conf
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.transport.session import BrokerSettings, Session
from vox_mqtt.transport.wire import PACKETS_PER_TURN


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
# of Python, so the socket never runs dry while they are read. An unbounded read took
# 7,431 of them in one turn, with 20,000 as with 100,000: the count does not need more.
BURST = 20_000


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


# What one turn of the event loop may take in from the socket: one read of at most
# PACKETS_PER_TURN packets from epoll's callback and one from its scheduled resume.
MOST_PER_TURN = 2 * PACKETS_PER_TURN


@pytest.mark.slow
async def test_a_burst_that_keeps_the_socket_full_leaves_the_event_loop_its_turns(
    broker_factory: Factory,
) -> None:
    """Counted in turns of the loop, not seconds: a busy machine cannot change the count.

    A probe task that yields at every turn (sleep(0)) sees how many messages arrived
    since its last turn. Reading everything the socket held in one go (thousands of
    packets, which kept timers and tasks waiting 3.5 s here and 19 s on a starved machine)
    shows as one turn with thousands of arrivals. The time itself is a bench figure
    (`python -m bench --only burst_read`).
    """
    broker = broker_factory(conf("allow_anonymous true", f"max_queued_messages {2 * BURST}"))
    await asyncio.to_thread(retain_burst, broker.port)
    taken = 0
    most_in_one_turn = turns = 0
    session = Session(
        sessionkit.settings(broker.port), subscriptions=["b/#"], mark_retained_end=True
    )

    def arrived() -> int:
        return taken + session.queued

    async def probe() -> None:
        nonlocal most_in_one_turn, turns
        last = arrived()
        while True:
            await asyncio.sleep(0)
            now = arrived()
            most_in_one_turn = max(most_in_one_turn, now - last)
            turns += 1
            last = now

    async def take() -> None:
        nonlocal taken
        async for _ in session.messages():
            taken += 1

    async with session:
        prober, reader = asyncio.ensure_future(probe()), asyncio.ensure_future(take())
        try:
            assert await session.caught_up(120)
        finally:
            prober.cancel()
            reader.cancel()
    assert taken == BURST
    assert turns >= BURST // MOST_PER_TURN, f"{turns} turns of the loop for {BURST} messages"
    assert most_in_one_turn <= MOST_PER_TURN, (
        f"one turn of the event loop took in {most_in_one_turn} messages"
    )
