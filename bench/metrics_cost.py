"""Figure 12: what counting metrics costs on the hot path (one hop and throughput, on vs off).

The same agents on the same broker, once with metrics on (the default) and once with
`AgentConfig(metrics=False)`, whose counters and histograms count nothing. The two are
interleaved in rounds so a change of load on a shared machine hits both alike. One hop:
sequential operator -> root `ping` round trips (p50; the best round). Throughput:
concurrent `echo` through root -> coordinator -> two specialists (the best round).
Also, independent of load: the time of one counter increment and one histogram
observation, the counting calls one hop makes at both ends, and their product.

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
from vox_mqtt.observe.metrics import AgentMetrics

PARAMS = {"text": "hello"}
ALL = ["root", "coordinator", "spec_a", "spec_b"]


def sizes(quick: bool) -> tuple[int, int, int, float]:
    """Return (rounds, round trips per round, concurrency, throughput seconds per round)."""
    return (1, 20, 4, 0.5) if quick else (3, 300, 32, 4.0)


def events(metrics: AgentMetrics) -> int:
    """Return how many counting calls an agent's metrics have taken so far."""
    total = sum(counter.total() for counter in metrics.counters.values())
    total += metrics.duplicates + metrics.resends + metrics.delivery_failures
    total += metrics.reconnects
    commits = sum(metrics.ledger_commit_seconds.counts)
    # A commit is two calls (records added, latency observed); other timings are one.
    total += 2 * commits
    total += sum(sum(h.counts) for h in metrics.histograms.values()) - commits
    return total


async def one_hop_p50(bench: BenchBroker, metrics: bool, count: int) -> tuple[float, float]:
    """Return the p50 in ms of sequential operator -> root round trips, and events per hop."""
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        operator, agents = await start_vox(stack, bench, ["root"], metrics=metrics)
        for _ in range(max(3, count // 10)):
            await operator.request("ping", PARAMS, to=root)
        both = (operator.metrics, agents["root"].metrics)
        before = sum(events(m) for m in both)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await operator.request("ping", PARAMS, to=root)
            times.append((time.perf_counter() - started) * 1000)
        counted = sum(events(m) for m in both) - before
    return statistics.median(times), counted / count


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
    per_hop: list[float] = []
    through: dict[bool, list[float]] = {True: [], False: []}
    with bench_broker(workdir, fleet_text(SEED_SHAPE)) as bench:
        for _ in range(rounds):
            for metrics in (False, True):
                p50, counted = await one_hop_p50(bench, metrics, count)
                hop[metrics].append(p50)
                if metrics:
                    per_hop.append(counted)
            for metrics in (False, True):
                through[metrics].append(await rate(bench, metrics, concurrency, seconds))
    # The least disturbed round of each: on a shared machine, load only ever adds time.
    hop_on, hop_off = min(hop[True]), min(hop[False])
    rate_on, rate_off = max(through[True]), max(through[False])
    event = per_event_ns(quick)
    hop_events = statistics.median(per_hop)
    event["events_per_hop"] = round(hop_events, 1)
    # Counting calls one hop makes (both ends) x the cost of one: independent of load.
    event["cost_per_hop_us"] = round(hop_events * event["vox"] / 1000, 2)
    event["share_of_hop_p50_percent"] = round(100 * hop_events * event["vox"] / 1e6 / hop_on, 3)
    return [
        event,
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
    """Measure figure 12 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
