"""A look takes every retained message its subscriptions bring and knows where they end
(Session(mark_retained_end=True), docs/broker.md): against a real Mosquitto whose queue is
sized as `vox broker render` sizes it, through a relay that stalls the stream like a starved
broker, and against the 1,000 of a config that is not sized, which drops messages."""

from __future__ import annotations

import asyncio

import paho.mqtt.client as mqtt
import pytest

from tests.kits.faultkit import TcpProxy
from tests.kits.sessionkit import Factory, conf, settings
from vox_mqtt.broker.render import queue_limits
from vox_mqtt.transport.session import Session

# 5,000 agents' liveness and war-room topics: far more than a loopback socket and
# Mosquitto's default queue of 1,000 take at once.
AGENTS = 5000
RETAINED = 4 * AGENTS
PAYLOAD = b'{"status": "ACTIVE", "metrics": "' + b"x" * 900 + b'"}'


def retain_all(port: int) -> None:
    """Publish RETAINED retained messages with a raw paho client, each acknowledged."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [
            client.publish(f"vox/{n:05d}/status", PAYLOAD, qos=1, retain=True)
            for n in range(RETAINED)
        ]
        for info in infos:
            info.wait_for_publish(timeout=30)
    finally:
        client.disconnect()
        client.loop_stop()


async def look_through(port: int, wait: float) -> tuple[bool, int]:
    """Look at every retained message through port; return (caught up, messages taken)."""
    taken = 0
    session = Session(settings(port), subscriptions=["vox/+/status"], mark_retained_end=True)

    async def take() -> None:
        nonlocal taken
        async for _ in session.messages():
            taken += 1

    async with session:
        reader = asyncio.ensure_future(take())
        try:
            caught_up = await session.caught_up(wait)
            return caught_up, taken  # the reader takes nothing past the marker: there is none
        finally:
            reader.cancel()


@pytest.mark.slow
async def test_a_look_takes_every_retained_message_through_a_stall_and_ends_at_the_marker(
    broker_factory: Factory,
) -> None:
    messages, queued_bytes = queue_limits(AGENTS)
    broker = broker_factory(
        conf(
            "allow_anonymous true",
            f"max_queued_messages {messages}",
            f"max_queued_bytes {queued_bytes}",
        )
    )
    await asyncio.to_thread(retain_all, broker.port)
    proxy = TcpProxy(broker.port)
    try:
        # A pause of 1.5 s a few hundred messages in: a look that took quiet for the end
        # (it waited for 0.3 s without a message) listed what came before it.
        proxy.stall_downstream(after_bytes=400_000, seconds=1.5)
        caught_up, taken = await look_through(proxy.port, wait=60)
    finally:
        proxy.close()
    assert proxy.stalls == 1
    assert caught_up
    assert taken == RETAINED


@pytest.mark.slow
async def test_an_unsized_queue_drops_retained_messages_and_the_look_is_not_caught_up(
    broker_factory: Factory,
) -> None:
    # The control: the same burst and the same stall against Mosquitto's default queue,
    # which the rendered config had before it was sized to the fleet. Without the stall it
    # depended on the look reading slower than the broker sends, which a fast reader on a
    # quiet core does not: 20,000 of 20,000 taken once. While the relay holds, the broker
    # can hand nothing on, so past its socket's buffers it queues, and drops beyond 1,000.
    broker = broker_factory(conf("allow_anonymous true", "max_queued_messages 1000"))
    await asyncio.to_thread(retain_all, broker.port)
    proxy = TcpProxy(broker.port)
    try:
        proxy.stall_downstream(after_bytes=400_000, seconds=3)
        caught_up, taken = await look_through(proxy.port, wait=8)
    finally:
        proxy.close()
    print(f"caught up: {caught_up}, {taken} of {RETAINED} taken")
    assert proxy.stalls == 1
    assert taken < RETAINED
