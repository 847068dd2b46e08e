"""Figure 18: reading a burst of retained messages, and what the event loop waits meanwhile.

A look, a master after a restart or a console on a large fleet subscribes and receives
thousands of retained messages at once: the broker writes them in milliseconds, reading
them is Python's work, so the socket never runs dry while they are read. The transport
handles at most `PACKETS_PER_TURN` packets per turn of the event loop
(vox_mqtt/transport/wire.py) so that timers and tasks keep their turns; the test
suite counts those turns (tests/integration/test_transport_reads.py), this figure gives the
seconds: how long a `Session` takes to catch up on N tiny retained messages, and the
longest wait a 10 ms timer saw meanwhile. Baseline: a bare aiomqtt client reading the same
retained messages (aiomqtt reads what paho gives it, one socket read per packet).

    python -m bench.burst_read [--quick]
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench.common import figure, run_alone
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.transport.session import BrokerSettings, Session

ROUNDS = 3


def sizes(quick: bool) -> int:
    """Return how many retained messages the burst holds."""
    return 2_000 if quick else 100_000


def _retain(port: int, count: int) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for n in range(count - 1):
            client.publish(f"b/{n}", b"x", qos=0, retain=True)
        client.publish(f"b/{count - 1}", b"x", qos=1, retain=True).wait_for_publish(timeout=120)
    finally:
        client.disconnect()
        client.loop_stop()


async def _watched(read: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Run read() beside a 10 ms timer; return (seconds, the timer's longest wait)."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last - 0.01)
            last = now

    ticker = asyncio.ensure_future(tick())
    started = time.perf_counter()
    try:
        await read()
    finally:
        ticker.cancel()
    return time.perf_counter() - started, max(gaps, default=0.0)


async def _vox_round(port: int, count: int) -> tuple[float, float]:
    settings = BrokerSettings(port=port, client_id=str(uuid4()), connect_timeout=10.0)
    session = Session(settings, subscriptions=["b/#"], mark_retained_end=True)
    taken = 0

    async def take() -> None:
        nonlocal taken
        async for _ in session.messages():
            taken += 1

    async def read() -> None:
        reader = asyncio.ensure_future(take())
        try:
            if not await session.caught_up(600):
                raise RuntimeError("the burst was not read within 600 s")
        finally:
            reader.cancel()

    async with session:
        outcome = await _watched(read)
    if taken != count:
        raise RuntimeError(f"read {taken} of {count} retained messages")
    return outcome


async def _raw_round(port: int, count: int) -> tuple[float, float]:
    async with aiomqtt.Client(
        "127.0.0.1", port, identifier=str(uuid4()), protocol=aiomqtt.ProtocolVersion.V5
    ) as client:

        async def read() -> None:
            await client.subscribe("b/#", qos=1)
            seen = 0
            async for _ in client.messages:
                seen += 1
                if seen == count:
                    return

        return await _watched(read)


Round = Callable[[int, int], Coroutine[Any, Any, tuple[float, float]]]


def _rounds(port: int, count: int, one: Round) -> tuple[float, float]:
    seconds, waits = [], []
    for _ in range(ROUNDS):
        # The collector's pauses grow with what is alive; they are not the reader's.
        gc.collect()
        gc.disable()
        try:
            took, waited = asyncio.run(one(port, count))
        finally:
            gc.enable()
        seconds.append(took)
        waits.append(waited)
    return statistics.median(seconds), statistics.median(waits)


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 18: a Session catching up on a retained burst, against bare aiomqtt."""
    count = sizes(quick)
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "mosquitto.conf"
    port = free_port()
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"max_queued_messages {2 * count}\n",
        encoding="utf-8",
    )
    with LocalBroker(conf, port=port):
        _retain(port, count)
        vox_s, vox_wait = _rounds(port, count, _vox_round)
        raw_s, raw_wait = _rounds(port, count, _raw_round)
    return [
        figure(
            title=f"Session: catch up on {count} retained messages (median of {ROUNDS})",
            unit="s",
            vox=vox_s,
            baseline=raw_s,
            target="none: measured",
            met=None,
            messages=count,
        ),
        figure(
            title=f"longest wait of a 10 ms timer while {count} retained messages are read",
            unit="ms",
            vox=vox_wait * 1000,
            baseline=raw_wait * 1000,
            target="< 100 ms: timers and tasks keep their turns",
            met=None if quick else vox_wait < 0.1,
            messages=count,
        ),
    ]


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
