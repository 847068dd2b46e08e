"""Figure 1: one hop, operator -> root command round trip, against a raw request/response.

VOX: the operator (an in-process VOXAgent) sends command_request `ping` to the root, which
records it, acknowledges it and answers with command_result; the operator records and
acknowledges the result. Raw: two aiomqtt clients with the same identities, one QoS 1 request
and one QoS 1 response. N sequential round trips each, after a warm-up; p50 and p99.

    python -m bench.one_hop [--quick]
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.common import (
    SEED_SHAPE,
    BenchBroker,
    bench_broker,
    figure,
    fleet_text,
    latency_summary,
    run_alone,
)
from bench.rawmqtt import Journal, RawNode
from bench.voxside import start_vox

PARAMS = {"text": "hello"}


def sizes(quick: bool) -> tuple[int, int]:
    """Return (round trips, warm-up round trips)."""
    return (20, 3) if quick else (500, 30)


async def raw_round_trips(
    bench: BenchBroker, chain: list[str], count: int, warmup: int, *, durable: bool = False
) -> list[float]:
    """Time sequential raw requests from chain[0] down the chain (relays) and back.

    durable: each node also acknowledges and commits as a VOX hop must (rawmqtt.Journal).
    """
    async with AsyncExitStack() as stack:
        nodes = []
        for index, name in enumerate(chain):
            master = chain[index - 1] if index else None
            children = tuple(chain[index + 1 : index + 2])
            journal = None
            if durable:
                journal = Journal(bench.workdir / f"journal-{len(chain)}-{name}.db")
            nodes.append(
                await stack.enter_async_context(
                    RawNode(bench, name, master=master, children=children, journal=journal)
                )
            )
        first = bench.id(chain[1])
        for _ in range(warmup):
            await nodes[0].request(first, PARAMS)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await nodes[0].request(first, PARAMS)
            times.append((time.perf_counter() - started) * 1000)
    return times


async def vox_round_trips(
    bench: BenchBroker, names: list[str], command: str, count: int, warmup: int
) -> list[float]:
    """Time sequential VOX command round trips from the operator to the root."""
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        operator, _ = await start_vox(stack, bench, names)
        for _ in range(warmup):
            await operator.request(command, PARAMS, to=root)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            reply = await operator.request(command, PARAMS, to=root)
            times.append((time.perf_counter() - started) * 1000)
        assert reply.details["result"] == PARAMS, reply.details
    return times


async def compare_chain(
    workdir: Path,
    chain: list[str],
    command: str,
    *,
    title: str,
    count: int,
    warmup: int,
    bound: float,
) -> dict[str, Any]:
    """Time raw relays and VOX down `chain` and back on one broker, as one figure row."""
    # Raw first, so no VOX session ever queues raw traffic.
    with bench_broker(workdir, fleet_text(SEED_SHAPE)) as bench:
        raw = latency_summary(await raw_round_trips(bench, chain, count, warmup))
        floor = latency_summary(await raw_round_trips(bench, chain, count, warmup, durable=True))
        vox = latency_summary(await vox_round_trips(bench, chain[1:], command, count, warmup))
    ratio = vox["p50_ms"] / raw["p50_ms"]
    return figure(
        title=title,
        unit="ms",
        vox=vox["p50_ms"],
        baseline=raw["p50_ms"],
        target=f"VOX p50 <= {bound:g} x raw",
        met=ratio <= bound,
        vox_detail=vox,
        baseline_detail=raw,
        p99_ratio=round(vox["p99_ms"] / raw["p99_ms"], 2),
        # Raw clients that acknowledge and commit as a hop must: the guarantees' own price.
        obligations_detail=floor,
        obligations_ratio=round(floor["p50_ms"] / raw["p50_ms"], 2),
        vox_over_obligations=round(vox["p50_ms"] / floor["p50_ms"], 2),
    )


async def measure(workdir: Path, quick: bool) -> dict[str, Any]:
    """Time operator -> root round trips, raw and VOX."""
    count, warmup = sizes(quick)
    return await compare_chain(
        workdir,
        ["operator", "root"],
        "ping",
        title="One hop: operator -> agent command round trip (p50)",
        count=count,
        warmup=warmup,
        bound=3.0,
    )


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 1 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 1 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
