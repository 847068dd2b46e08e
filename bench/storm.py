"""A broker restart under a fleet on one broker, with and without the reconnect spread.

    python -m bench.storm [--agents 1000] [--down 0] [--spreads sized,0.5,0.01] [--quick]

For each spread (`sized`: what `vox agent render` writes, agents / CONNECTS_PER_SECOND, at
least 0.5 s; a number: that first reconnect window for every agent, 0.01 standing for no
jitter) a fresh fleet (a fanout-10 tree, heartbeat 15 s, agents in 4 worker processes as
figure 9 runs them) is started, the broker is stopped, kept down `--down` seconds and
started again. Reported per spread:
- seconds from the broker's start until a fresh look has every agent's live ACTIVE status
  of a newer epoch (each agent reconnected and announced its birth);
- the broker's CPU peak (% of one core, 0.5 s samples) and its CPU seconds over the first
  30 s, the worker processes' CPU seconds over the same time;
- the births per second the broker took at the busiest second (live statuses seen).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import aiomqtt
import psutil

from bench.common import (
    BenchBroker,
    active_count,
    bench_broker,
    fleet_text,
    fresh_look,
    spawn_worker,
    stop_workers,
    tree_shape,
    workers_ready,
)
from bench.rawmqtt import raw_client
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.observe.status import ACTIVE, AgentLiveness
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.storm import reconnect_spread

WORKERS = 4
HEARTBEAT = 15.0
SAMPLE = 0.5
AFTER = 30.0  # seconds sampled after the broker's start


def cpu_seconds(pid: int) -> float:
    """Return a process's user + system CPU seconds."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def start_workers(
    bench: BenchBroker, workdir: Path, names: list[str], spread: float | None
) -> list[asyncio.subprocess.Process]:
    """Start the agents in WORKERS processes; return once every one says ready."""
    options = ["--heartbeat", str(HEARTBEAT)]
    options += [] if spread is None else ["--reconnect-spread", str(spread)]
    workers = [
        await spawn_worker(bench, workdir / "fleet.toml", workdir, names[i::WORKERS], *options)
        for i in range(WORKERS)
    ]
    await workers_ready(workers, 900)
    return workers


async def look_epochs(console_file: Path, agents: int) -> dict[UUID, int]:
    """Wait until a fresh look sees every agent ACTIVE; return their epochs."""
    async with fresh_look(console_file) as view, asyncio.timeout(300):
        while active_count(view) < agents:  # noqa: ASYNC110 - the view is filled by another task
            await asyncio.sleep(0.2)
        return {a.id: a.epoch for a in view.agents()}


async def births_per_second(bench: BenchBroker, seconds: float) -> list[int]:
    """Count the live statuses a raw reader receives, per second, for `seconds`."""
    counts = [0] * int(seconds)
    started = time.perf_counter()
    reader: aiomqtt.Client = raw_client(bench, "explorer")
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        async with reader, asyncio.timeout(seconds):
            await reader.subscribe(topics.STATUS_FILTER, qos=0)
            async for message in reader.messages:
                if not message.retain:
                    at = int(time.perf_counter() - started)
                    if at < len(counts):
                        counts[at] += 1
    return counts


async def all_back(
    console_file: Path,
    before: dict[UUID, int],
    reconnected: set[UUID] | None = None,
    timeout: float = 300,
) -> float:
    """Return the seconds until a look has every agent's live ACTIVE status, of a newer
    epoch for those that reconnected (all of them when reconnected is None)."""
    started = time.perf_counter()

    def back(agent: AgentLiveness) -> bool:
        newer = reconnected is not None and agent.id not in reconnected
        newer = newer or agent.epoch > before.get(agent.id, 0)
        return agent.status == ACTIVE and not agent.retained and newer

    async with fresh_look(console_file) as view, asyncio.timeout(timeout):
        while sum(back(a) for a in view.agents()) < len(before):  # noqa: ASYNC110 - the view is filled by another task
            await asyncio.sleep(0.1)
    return time.perf_counter() - started


async def sample(pids: list[int], seconds: float) -> tuple[float, list[float]]:
    """Return the first pid's CPU peak (% of one core) and every pid's CPU seconds."""
    first = [cpu_seconds(pid) for pid in pids]
    peak, last = 0.0, first[0]
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        at = time.perf_counter()
        await asyncio.sleep(SAMPLE)
        now = cpu_seconds(pids[0])
        peak = max(peak, 100 * (now - last) / (time.perf_counter() - at))
        last = now
    return round(peak, 1), [round(cpu_seconds(p) - f, 2) for p, f in zip(pids, first, strict=True)]


async def one_run(workdir: Path, agents: int, down: float, spread: float | None) -> dict[str, Any]:
    """Start a fleet with one spread, restart its broker, measure the return."""
    text = fleet_text(tree_shape(agents, 10), heartbeat=HEARTBEAT)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "fleet.toml").write_text(text)
    with bench_broker(workdir, text) as bench:
        console_file = render_agent_config(
            bench.fleet, "operator", bench.root, workdir / "etc" / "operator.toml",
            workdir / "console",
        ).config  # fmt: skip
        names = [spec.name for spec in bench.fleet]
        workers = await start_workers(bench, workdir, names, spread)
        try:
            before = await look_epochs(console_file, agents)
            await asyncio.sleep(2.0)
            broker = bench.broker
            assert broker is not None
            broker.stop()
            await asyncio.sleep(down)
            broker.start()
            pids = [broker.pid, *(w.pid for w in workers)]
            sampling = asyncio.ensure_future(sample(pids, AFTER))
            births = asyncio.ensure_future(births_per_second(bench, AFTER))
            back = await all_back(console_file, before)
            peak, cpu = await sampling
            per_second = await births
        finally:
            await stop_workers(workers)
    return {
        "agents": agents,
        "down_seconds": down,
        "spread_seconds": round(spread if spread is not None else reconnect_spread(agents), 3),
        "seconds_until_all_active_again": round(back, 2),
        "broker_cpu_peak_percent_of_one_core": peak,
        "broker_cpu_seconds_first_30s": cpu[0],
        "workers_cpu_seconds_first_30s": round(sum(cpu[1:]), 1),
        "live_statuses_busiest_second": max(per_second),
        "live_statuses_first_seconds": per_second[:8],
    }


def main() -> int:
    """Run every spread asked for and print the figures as JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--down", type=float, default=0.0)
    parser.add_argument("--spreads", default="sized,0.5,0.01")
    parser.add_argument("--quick", action="store_true", help="40 agents, one spread")
    args = parser.parse_args()
    agents, spreads = args.agents, args.spreads.split(",")
    if args.quick:
        agents, spreads = 40, ["sized"]
    with tempfile.TemporaryDirectory(prefix="vox-storm-") as tmp:
        for index, text in enumerate(spreads):
            spread = None if text == "sized" else float(text)
            result = asyncio.run(one_run(Path(tmp) / str(index), agents, args.down, spread))
            result["load_1m_5m_15m"] = [round(x, 2) for x in os.getloadavg()]
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
