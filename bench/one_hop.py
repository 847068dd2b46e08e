"""Figure 1: one hop, operator -> root command round trip, against a raw request/response.

VOX: the operator (an in-process VOXAgent) sends command_request `ping` to the root, which
records it, acknowledges it and answers with command_result; the operator records and
acknowledges the result. Raw: two aiomqtt clients with the same identities, one QoS 1 request
and one QoS 1 response. N sequential round trips each, after a warm-up; p50 and p99.
VOX runs twice against the same raw baseline: every agent in this process (all-in-one), then
each agent in its own `vox-agent` daemon (process per agent, bench/deployed.py).

    python -m bench.one_hop [--quick]
"""

from __future__ import annotations

import asyncio
import cProfile
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
from bench.deployed import start_deployed
from bench.profiling import summarize
from bench.rawmqtt import RAW_CLIENTS, Journal, RawNode
from bench.voxside import seed_role_specs, start_vox

PARAMS = {"text": "hello"}
# The two layouts of the VOX side: how their rows are named.
ALL_IN_ONE = "all-in-one"
PER_PROCESS = "process per agent"
LAYOUTS = (ALL_IN_ONE, PER_PROCESS)
TURNS_SAMPLE = 100  # round trips profiled to count the event loop's turns (all-in-one)


def sizes(quick: bool) -> tuple[int, int]:
    """Return (round trips, warm-up round trips)."""
    return (20, 3) if quick else (500, 30)


async def raw_round_trips(
    bench: BenchBroker,
    chain: list[str],
    count: int,
    warmup: int,
    *,
    durable: bool = False,
    client: str = "aiomqtt",
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
                    RawNode(
                        bench,
                        name,
                        master=master,
                        children=children,
                        journal=journal,
                        client=client,
                    )
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
    bench: BenchBroker,
    names: list[str],
    command: str,
    count: int,
    warmup: int,
    *,
    layout: str = ALL_IN_ONE,
    turns: list[float] | None = None,
) -> list[float]:
    """Time sequential VOX command round trips from the operator to the root.

    layout: ALL_IN_ONE (the agents in this process) or PER_PROCESS (a daemon each).
    turns: with ALL_IN_ONE, given the turns of the event loop per round trip (every agent's,
    they share the loop), counted by cProfile over TURNS_SAMPLE more round trips after the
    timed ones (the profiler's cost is not in the times).
    """
    root = bench.id("root")
    async with AsyncExitStack() as stack:
        if layout == PER_PROCESS:
            operator, _ = await start_deployed(stack, bench, names)
        else:
            operator, _ = await start_vox(stack, bench, names)
        for _ in range(warmup):
            await operator.request(command, PARAMS, to=root)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            reply = await operator.request(command, PARAMS, to=root)
            times.append((time.perf_counter() - started) * 1000)
        assert reply.details["result"] == PARAMS, reply.details
        if turns is not None and layout == ALL_IN_ONE:
            sample = min(TURNS_SAMPLE, count)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(sample):
                await operator.request(command, PARAMS, to=root)
            profiler.disable()
            turns.append(round(summarize(profiler)["loop_turns"] / sample, 1))
    return times


def titled(title: str, layout: str) -> str:
    """Return a figure's title for a layout: the process-per-agent row says so."""
    if layout == ALL_IN_ONE:
        return title
    head, sep, tail = title.partition(":")
    return f"{head} ({layout}){sep}{tail}"


async def compare_chain(
    workdir: Path,
    chain: list[str],
    command: str,
    *,
    title: str,
    count: int,
    warmup: int,
    bound: float,
    layouts: tuple[str, ...] = LAYOUTS,
) -> list[dict[str, Any]]:
    """Time raw relays and VOX down `chain` and back on one broker: a row per VOX layout."""
    # Raw first, so no VOX session ever queues raw traffic.
    with bench_broker(workdir, fleet_text(SEED_SHAPE, roles=seed_role_specs())) as bench:
        # Each raw client in turn; the faster one is the baseline (bench/rawmqtt.py).
        by_client = {
            name: latency_summary(await raw_round_trips(bench, chain, count, warmup, client=name))
            for name in RAW_CLIENTS
        }
        fastest = min(by_client, key=lambda name: by_client[name]["p50_ms"])
        raw = by_client[fastest]
        floor = latency_summary(
            await raw_round_trips(bench, chain, count, warmup, durable=True, client=fastest)
        )
        turns: list[float] = []
        measured = {
            layout: latency_summary(
                await vox_round_trips(
                    bench, chain[1:], command, count, warmup, layout=layout, turns=turns
                )
            )
            for layout in layouts
        }
    rows = []
    for layout, vox in measured.items():
        # Judged against the floor measured in the same run, not raw (docs/performance.md,
        # "The price of the guarantees alone"): raw's ratio is reported, not targeted.
        over_floor = vox["p50_ms"] / floor["p50_ms"]
        # Loop turns are counted in the all-in-one layout only (the agents share its loop).
        counted: dict[str, Any] = {}
        if layout == ALL_IN_ONE and turns:
            counted["loop_turns_per_round_trip"] = turns[0]
        rows.append(
            figure(
                title=titled(title, layout),
                unit="ms",
                vox=vox["p50_ms"],
                baseline=raw["p50_ms"],
                target=f"VOX p50 <= {bound:g} x the obligations floor",
                met=over_floor <= bound,
                layout=layout,
                vox_detail=vox,
                baseline_detail=raw,
                baseline_client=fastest,
                baseline_p50_ms_by_client={k: v["p50_ms"] for k, v in by_client.items()},
                p99_ratio=round(vox["p99_ms"] / raw["p99_ms"], 2),
                # Raw clients that acknowledge and commit as a hop must: the guarantees' price.
                obligations_detail=floor,
                obligations_ratio=round(floor["p50_ms"] / raw["p50_ms"], 2),
                vox_over_obligations=round(vox["p50_ms"] / floor["p50_ms"], 2),
                **counted,
            )
        )
    return rows


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Time operator -> root round trips, raw and VOX in both layouts."""
    count, warmup = sizes(quick)
    return await compare_chain(
        workdir,
        ["operator", "root"],
        "ping",
        title="One hop: operator -> agent command round trip (p50)",
        count=count,
        warmup=warmup,
        bound=1.2,
    )


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 1 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 1 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
