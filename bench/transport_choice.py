"""The measurement that chose the transport (docs/transport.md, "Why this transport").

Four ways to carry the same MQTT v5 QoS 1 traffic, each in a process of its own against
one real Mosquitto (anonymous, on a free port), two connections per process (a publisher and
a subscriber, as one hop has):

- `session`: the transport's Session of the tree on PYTHONPATH (run it with the old tree
  first on the path to measure the transport before the change: --old-tree);
- `wire`: an asyncio Protocol over the sans-I/O `mqtt5` codec (vox_mqtt/transport/wire.py),
  without the session around it;
- `aiomqtt`: aiomqtt (over paho) through its public API only;
- `zmqtt`: zmqtt (pure asyncio) through its public API only.

Each process runs `--round-trips` sequential round trips (publish at QoS 1, await the PUBACK,
await the message at the subscriber) and then a burst (`--burst` publishes at once, until the
subscriber has them all), then counts the turns of the event loop per round trip. Figures:
CPU of this process per message (time.process_time, the broker excluded), the round trip's
p50, the turns per round trip. The contenders run in alternating order,
`--runs` times; the report gives each one's median over the runs.

    PYTHONPATH=$PWD python -m bench.transport_choice --runs 3 --old-tree /path/to/old/tree
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.profiling import summarize
from vox_mqtt.broker.local import LocalBroker, free_port

CONTENDERS = ("session", "wire", "aiomqtt", "zmqtt")
TOPIC = "bench/choice"
# A VOX message's shape: ~300 bytes of JSON, content type, payload format, 3 user properties.
PAYLOAD = json.dumps({"type": "request", "body": "x" * 240, "id": "0" * 32}).encode()
USER_PROPERTIES = (("vox-type", "request"), ("vox-from", "alpha"), ("vox-to", "beta"))
RECEIVE_MAXIMUM = 100


class Meter:
    """Round trips then a burst, on one contender's publish and receive."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[None] = asyncio.Queue()
        self.count = 0
        self.burst_done: asyncio.Future[None] | None = None
        self.burst_target = 0

    def got(self) -> None:
        """Count one message at the subscriber."""
        self.count += 1
        if self.burst_done is not None:
            if self.count >= self.burst_target and not self.burst_done.done():
                self.burst_done.set_result(None)
        else:
            self.received.put_nowait(None)

    async def turns(self, publish: Callable[[], Awaitable[None]], round_trips: int) -> float:
        """Return the turns of the event loop per round trip: calls of its _run_once, counted
        by cProfile after the timed phases (the profiler's cost is not in their CPU)."""
        self.burst_done = None
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(round_trips):
            await publish()
            await self.received.get()
        profiler.disable()
        return float(summarize(profiler)["loop_turns"]) / round_trips

    async def run(
        self, publish: Callable[[], Awaitable[None]], round_trips: int, burst: int
    ) -> dict[str, float]:
        """Return CPU per message (us) and round trip p50 (ms), then the burst's CPU."""
        for _ in range(50):  # warm up
            await publish()
            await self.received.get()
        samples = []
        cpu = time.process_time()
        for _ in range(round_trips):
            start = time.perf_counter()
            await publish()
            await self.received.get()
            samples.append(time.perf_counter() - start)
        rt_cpu = time.process_time() - cpu
        self.burst_done = asyncio.get_running_loop().create_future()
        self.count, self.burst_target = 0, burst
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(publish() for _ in range(burst)))
        await self.burst_done
        burst_cpu, burst_wall = time.process_time() - cpu, time.perf_counter() - wall
        turns = await self.turns(publish, min(round_trips, 200))
        return {
            "loop_turns_per_round_trip": turns,
            "rt_cpu_us": rt_cpu / round_trips * 1e6,
            "rt_p50_ms": statistics.median(samples) * 1e3,
            "burst_cpu_us": burst_cpu / burst * 1e6,
            "burst_msgs_per_s": burst / burst_wall,
        }


async def run_session(port: int, round_trips: int, burst: int) -> dict[str, float]:
    from vox_mqtt.protocol.settings import BrokerSettings
    from vox_mqtt.transport.publishprops import vox_properties
    from vox_mqtt.transport.session import Session

    meter = Meter()
    props = vox_properties(type="request", sender="alpha", target="beta")

    def settings(name: str) -> BrokerSettings:
        return BrokerSettings(port=port, client_id=f"choice-{name}-{os.getpid()}")

    async with (
        Session(settings("sub"), subscriptions=[TOPIC]) as sub,
        Session(settings("pub"), subscriptions=[]) as pub,
    ):

        async def read() -> None:
            async for _ in sub.messages():
                meter.got()

        reader = asyncio.create_task(read())

        async def publish() -> None:
            await pub.publish(TOPIC, PAYLOAD, props=props)

        result = await meter.run(publish, round_trips, burst)
        reader.cancel()
    return result


async def run_wire(port: int, round_trips: int, burst: int) -> dict[str, float]:
    from vox_mqtt.protocol.settings import BrokerSettings
    from vox_mqtt.transport.publishprops import packed_bytes, vox_properties
    from vox_mqtt.transport.wire import Subscription, connect

    meter = Meter()
    packed = packed_bytes(vox_properties(type="request", sender="alpha", target="beta"))

    def settings(name: str) -> BrokerSettings:
        return BrokerSettings(port=port, client_id=f"choice-{name}-{os.getpid()}")

    sub = await connect(settings("sub"), will=None, tls=None, receive_maximum=RECEIVE_MAXIMUM)
    pub = await connect(settings("pub"), will=None, tls=None, receive_maximum=RECEIVE_MAXIMUM)

    def sink(_: object) -> bool:
        meter.got()
        return True

    sub.sink = sink
    await sub.subscribe([Subscription(TOPIC)], timeout=10)

    async def publish() -> None:
        outcome = await pub.publish_checked(TOPIC, PAYLOAD, 1, False, packed)
        assert outcome is not None
        assert outcome.accepted, outcome

    result = await meter.run(publish, round_trips, burst)
    await pub.close()
    await sub.close()
    return result


async def run_aiomqtt(port: int, round_trips: int, burst: int) -> dict[str, float]:
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    meter = Meter()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    props.PayloadFormatIndicator = 1
    props.UserProperty = list(USER_PROPERTIES)
    connect_props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    connect_props.ReceiveMaximum = RECEIVE_MAXIMUM

    def client(name: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            "127.0.0.1",
            port,
            identifier=f"choice-{name}-{os.getpid()}",
            protocol=aiomqtt.ProtocolVersion.V5,
            properties=connect_props,
            timeout=120,  # a burst of 3,000 on a loaded machine outlasts the default 10 s
        )

    async with client("sub") as sub, client("pub") as pub:
        pub.pending_calls_threshold = 10_000  # a burst is thousands in flight by design
        await sub.subscribe(TOPIC, qos=1)

        async def read() -> None:
            async for _ in sub.messages:
                meter.got()

        reader = asyncio.create_task(read())

        async def publish() -> None:
            await pub.publish(TOPIC, PAYLOAD, qos=1, properties=props)

        result = await meter.run(publish, round_trips, burst)
        reader.cancel()
    return result


async def run_zmqtt(port: int, round_trips: int, burst: int) -> dict[str, float]:
    import zmqtt

    meter = Meter()
    props = zmqtt.PublishProperties(
        content_type="application/json",
        payload_format_indicator=1,
        user_properties=USER_PROPERTIES,
    )

    def client(name: str) -> Any:
        return zmqtt.create_client(
            "127.0.0.1",
            port,
            client_id=f"choice-{name}-{os.getpid()}",
            version="5.0",
            receive_maximum=RECEIVE_MAXIMUM,
        )

    async with (
        client("sub") as sub,
        client("pub") as pub,
        sub.subscribe(TOPIC, qos=zmqtt.QoS.AT_LEAST_ONCE) as subscription,
    ):

        async def read() -> None:
            async for _ in subscription:
                meter.got()

        reader = asyncio.create_task(read())

        async def publish() -> None:
            await pub.publish(TOPIC, PAYLOAD, qos=zmqtt.QoS.AT_LEAST_ONCE, properties=props)

        result = await meter.run(publish, round_trips, burst)
        reader.cancel()
    return result


RUNNERS = {
    "session": run_session,
    "session-old": run_session,  # the same, run with the old tree first on the path
    "wire": run_wire,
    "aiomqtt": run_aiomqtt,
    "zmqtt": run_zmqtt,
}


def one(name: str, port: int, round_trips: int, burst: int) -> None:
    """Measure one contender in this process and print its figures as JSON."""
    print(json.dumps(asyncio.run(RUNNERS[name](port, round_trips, burst))))


def measure(
    contenders: list[str], runs: int, round_trips: int, burst: int, trees: dict[str, Path]
) -> dict[str, Any]:
    """Run each contender `runs` times in alternating order; return every run and the medians."""
    with tempfile.TemporaryDirectory(prefix="vox-choice-") as tmp:
        port = free_port()
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            # What `vox broker render` sets that bears on a connection (vox_mqtt/broker/render.py).
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "set_tcp_nodelay true\nmax_inflight_messages 20\nmax_queued_messages 100000\n",
            encoding="utf-8",
        )
        results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        with LocalBroker(conf, port=port) as _broker:
            for run in range(runs):
                order = contenders if run % 2 == 0 else list(reversed(contenders))
                for name in order:
                    tree = trees.get(name, Path.cwd())
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    # This file, run as a script: the old tree has no copy of it.
                    args = [sys.executable, str(Path(__file__).resolve()), "--one", name]
                    args += ["--port", str(port), "--round-trips", str(round_trips)]
                    args += ["--burst", str(burst)]
                    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
                    if out.returncode != 0:
                        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
                    results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = {
        name: {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
        for name, rows in results.items()
    }
    return {"runs": results, "median": medians}


def main() -> int:
    """Parse the command line; measure one contender (--one) or all of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=sorted(RUNNERS))
    parser.add_argument("--port", type=int)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument(
        "--old-tree",
        type=Path,
        help="a checkout of the tree before the transport change: `session-old` runs from it",
    )
    args = parser.parse_args()
    if args.one:
        one(args.one, args.port, args.round_trips, args.burst)
        return 0
    contenders = args.contenders.split(",")
    trees: dict[str, Path] = {}
    if args.old_tree is not None:
        contenders.append("session-old")
        trees["session-old"] = args.old_tree.resolve()
    report = measure(contenders, args.runs, args.round_trips, args.burst, trees)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
