"""Figure 9: what counting metrics costs on the hot path (one hop and throughput, on vs off).

The same agents on the same broker, once with metrics on (the default) and once with
`AgentConfig(metrics=False)`, whose counters and histograms count nothing. The two are
interleaved in rounds so a change of load on a shared machine hits both alike. One hop:
sequential operator -> root `ping` round trips (p50, median of the rounds). Throughput:
concurrent `echo` through root -> coordinator -> two specialists (median of the rounds).
Also, load-independent: the time of one counter increment and one histogram observation.

    python -m bench.metrics_cost [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.common import SEED_SHAPE, BenchBroker, bench_broker, figure, fleet_text, run_alone
from bench.throughput import drive
from bench.voxside import start_vox
from vox_mqtt.metrics import AgentMetrics

PARAMS = {"text": "hello"}
ALL = ["root", "coordinator", "spec_a", "spec_b"]


def sizes(quick: bool) -> tuple[int, int, int, float]:
    """Return (rounds, round trips per round, concurrency, throughput seconds per round)."""
    return (1, 20, 4, 0.5) if quick else (3, 300, 32, 4.0)


async def one_hop_p50(bench: BenchBroker, metrics: bool, count: int) -> float:
    """Return the p50 in ms of sequential operator -> root round trips."""
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        operator, _ = await start_vox(stack, bench, ["root"], metrics=metrics)
        for _ in range(max(3, count // 10)):
            await operator.request("ping", PARAMS, to=root)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await operator.request("ping", PARAMS, to=root)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def rate(bench: BenchBroker, metrics: bool, concurrency: int, seconds: float) -> float:
    """Return commands per second through the seed tree."""
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        operator, _ = await start_vox(stack, bench, ALL, metrics=metrics)

        async def call() -> None:
            await operator.request("echo", PARAMS, to=root)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        return await drive(call, concurrency, seconds)


def per_event_ns(quick: bool) -> dict[str, Any]:
    """Time one counter increment and one histogram observation, against a bare dict add."""
    metrics = AgentMetrics()
    n = 20_000 if quick else 1_000_000
    counter, histogram = metrics.messages_in, metrics.command_handler_seconds
    plain: dict[str, int] = {"command_request": 0}

    def timed(step: Callable[[], None]) -> float:
        started = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - started) / n * 1e9

    def bare() -> None:
        plain["command_request"] += 1

    inc_ns = timed(lambda: counter.inc("command_request"))
    observe_ns = timed(lambda: histogram.observe(0.003))
    bare_ns = timed(bare)
    return figure(
        title="Metrics cost per event: one labelled counter increment (ns)",
        unit="ns",
        vox=inc_ns,
        baseline=bare_ns,
        target="none set (baseline: a bare dict increment in a lambda)",
        met=None,
        histogram_observe_ns=round(observe_ns, 1),
        events=n,
    )


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Interleave metrics on and off for both figures; return one row each."""
    rounds, count, concurrency, seconds = sizes(quick)
    hop: dict[bool, list[float]] = {True: [], False: []}
    through: dict[bool, list[float]] = {True: [], False: []}
    with bench_broker(workdir, fleet_text(SEED_SHAPE)) as bench:
        for _ in range(rounds):
            for metrics in (False, True):
                hop[metrics].append(await one_hop_p50(bench, metrics, count))
            for metrics in (False, True):
                through[metrics].append(await rate(bench, metrics, concurrency, seconds))
    hop_on, hop_off = statistics.median(hop[True]), statistics.median(hop[False])
    rate_on, rate_off = statistics.median(through[True]), statistics.median(through[False])
    return [
        per_event_ns(quick),
        figure(
            title="Metrics cost, one hop: operator -> agent round trip p50, metrics on vs off",
            unit="ms",
            vox=hop_on,
            baseline=hop_off,
            target="on <= 1.05 x off",
            met=hop_on <= 1.05 * hop_off,
            rounds=rounds,
            round_trips_per_round=count,
            on_rounds=[round(x, 3) for x in hop[True]],
            off_rounds=[round(x, 3) for x in hop[False]],
        ),
        figure(
            title="Metrics cost, throughput: commands/s through the seed tree, on vs off",
            unit="commands/s",
            vox=rate_on,
            baseline=rate_off,
            target="on >= 0.95 x off",
            met=rate_on >= 0.95 * rate_off,
            higher_is_better=True,
            rounds=rounds,
            concurrency=concurrency,
            seconds_per_round=seconds,
            on_rounds=[round(x, 1) for x in through[True]],
            off_rounds=[round(x, 1) for x in through[False]],
        ),
    ]


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 9 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
