"""Figure 13: what a user would pick instead: FastStream MQTT RPC with a pydantic handler.

FastStream (MQTT v5, through its zmqtt client) logs in with the operator's and the root's
identities on the same broker, under client ids of its own, and asks the root's inbox topic
with `broker.request()`: QoS 1 request, a pydantic model in and out, the answer at QoS 1 on
the reply topic FastStream makes up (the only ACL lines added: `_zmqtt/reply/#` for those two
identities). No acknowledgements, no ledger, no re-sends. VOX is the same one hop as figure 1
(`ping`, operator -> root, ledgers with synchronous=FULL). Both sides: p50 of N sequential
round trips, then requests/s with C in flight.

    python -m bench.faststream_rpc [--quick]
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import (
    SEED_SHAPE,
    BenchBroker,
    bench_broker,
    figure,
    fleet_text,
    latency_summary,
    run_alone,
)
from bench.rawmqtt import GroupJournal, RawNode
from bench.throughput import drive
from bench.voxside import start_vox
from vox_mqtt.protocol import topics

PARAMS = {"text": "hello"}
REPLY_ACL = ["topic readwrite _zmqtt/reply/#"]


class Echo(BaseModel):
    """The request and the answer of the FastStream handler."""

    text: str


def sizes(quick: bool) -> tuple[int, int, int, float]:
    """Return (sequential round trips, warm-up, concurrency, seconds of the rate run)."""
    return (20, 3, 8, 1.0) if quick else (500, 30, 32, 5.0)


async def timed(call: Callable[[], Awaitable[Any]], count: int, warmup: int) -> list[float]:
    """Time `count` sequential calls after `warmup` untimed ones, in milliseconds."""
    for _ in range(warmup):
        await call()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def faststream_side(bench: BenchBroker, quick: bool) -> dict[str, Any]:
    """Serve Echo at the root's inbox with FastStream and measure requests from the operator."""
    from faststream.mqtt import MQTTBroker, QoS
    from faststream.mqtt.response import MQTTResponse
    from faststream.security import SASLPlaintext

    count, warmup, concurrency, seconds = sizes(quick)
    topic = topics.inbox(bench.id("root"), bench.id("operator"))
    quiet = logging.getLogger("bench.faststream")
    quiet.setLevel(logging.WARNING)

    def broker(name: str) -> MQTTBroker:
        creds = bench.creds(name)
        return MQTTBroker(
            host="127.0.0.1",
            port=bench.port,
            client_id=f"{creds.username}-fs",
            security=SASLPlaintext(username=creds.username, password=creds.password),
            logger=quiet,
        )

    server, client = broker("root"), broker("operator")

    @server.subscriber(topic, qos=QoS.AT_LEAST_ONCE)
    async def echo(body: Echo) -> MQTTResponse:
        return MQTTResponse(Echo(text=body.text), qos=QoS.AT_LEAST_ONCE)

    async def call() -> None:
        answer = await client.request(Echo(**PARAMS), topic, qos=QoS.AT_LEAST_ONCE, timeout=10.0)
        assert Echo.model_validate_json(answer.body).text == PARAMS["text"]

    async with server, client:
        await server.start()
        await client.start()
        latency = latency_summary(await timed(call, count, warmup))
        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        rate = await drive(call, concurrency, seconds)
    return {**latency, "requests_per_second": round(rate, 1)}


async def floor_side(bench: BenchBroker, quick: bool) -> dict[str, Any]:
    """Measure raw clients doing what a VOX hop must (rawmqtt.GroupJournal) the same two ways."""
    count, warmup, concurrency, seconds = sizes(quick)
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                RawNode(
                    bench,
                    name,
                    master=master,
                    children=children,
                    journal=GroupJournal(bench.workdir / f"journal-13-{name}.db"),
                )
            )
            for name, master, children in (("operator", None, ("root",)), ("root", "operator", ()))
        ]

        async def call() -> None:
            await nodes[0].request(root, PARAMS)

        latency = latency_summary(await timed(call, count, warmup))
        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        rate = await drive(call, concurrency, seconds)
    return {**latency, "requests_per_second": round(rate, 1)}


async def vox_side(bench: BenchBroker, quick: bool) -> dict[str, Any]:
    """Measure the VOX one hop the same two ways."""
    count, warmup, concurrency, seconds = sizes(quick)
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        operator, _ = await start_vox(stack, bench, ["root"])

        async def call() -> None:
            await operator.request("ping", PARAMS, to=root)

        latency = latency_summary(await timed(call, count, warmup))
        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        rate = await drive(call, concurrency, seconds)
    return {**latency, "requests_per_second": round(rate, 1)}


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Run FastStream first, then VOX, on one broker."""
    extra = {"operator": REPLY_ACL, "root": REPLY_ACL}
    with bench_broker(workdir, fleet_text(SEED_SHAPE), extra_acl=extra) as bench:
        fast = await faststream_side(bench, quick)
        floor = await floor_side(bench, quick)
        vox = await vox_side(bench, quick)
    concurrency = sizes(quick)[2]
    common: dict[str, Any] = {
        "vox_detail": vox,
        "baseline_detail": fast,
        "baseline_name": "FastStream",
        # Raw clients that acknowledge and commit as a hop must: the guarantees' price.
        "obligations_detail": floor,
    }
    rate_ratio = vox["requests_per_second"] / fast["requests_per_second"]
    return [
        figure(
            title="FastStream MQTT RPC (what a user would pick instead): one hop p50",
            unit="ms",
            vox=vox["p50_ms"],
            baseline=fast["p50_ms"],
            target="none set (baseline: FastStream, no acknowledgements or ledger)",
            met=None,
            **common,
        ),
        figure(
            title=f"FastStream MQTT RPC: one hop requests/s, {concurrency} in flight",
            unit="requests/s",
            vox=vox["requests_per_second"],
            baseline=fast["requests_per_second"],
            target="VOX >= 0.75 x FastStream (issue 29)",
            met=rate_ratio >= 0.75,
            higher_is_better=True,
            obligations_ratio=round(floor["requests_per_second"] / fast["requests_per_second"], 2),
            **common,
        ),
    ]


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 13 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 13 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
