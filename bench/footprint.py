"""Figure 6: footprint. One idle daemon, and a broker with a fleet of 200 agents.

- Idle daemon: RSS and CPU of one `vox-agent` over a quiet window (60 s; 5 s quick), against a
  bare paho client process (login, will, keepalive) sampled in the same window.
- Fleet: 200 agents (a tree with fanout 10) as in-process VOXAgents spread over 4 worker
  processes. Timed: from starting the workers until a watching console sees all ACTIVE, and
  what `vox status` waits for, a fresh operator console (OperatorConsole observing
  vox/+/status) connecting until all are ACTIVE in its view. Baseline: 200 bare aiomqtt
  clients each publishing a retained status, and a fresh bare subscriber receiving all 200.
  The broker's RSS is read with each fleet connected.

    python -m bench.footprint [--quick]
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiomqtt
import psutil

from bench import daemon_idle
from bench.common import (
    BenchBroker,
    active_count,
    bench_broker,
    figure,
    fleet_text,
    fresh_look,
    run_alone,
    spawn_worker,
    stop_workers,
    tree_shape,
)
from bench.rawmqtt import raw_client
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.observe.status import ACTIVE, FleetView
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.topics import STATUS_FILTER

WORKERS = 4


def sizes(quick: bool) -> tuple[float, int]:
    """Return (idle window seconds, fleet size)."""
    return (5.0, 20) if quick else (60.0, 200)


def rss_mib(pid: int) -> float:
    """Return a process's resident memory in MiB."""
    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


async def poll(predicate: Callable[[], bool], timeout: float) -> float:
    """Wait until predicate() holds; return the seconds it took."""
    started = time.perf_counter()
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the view is filled by another task
            await asyncio.sleep(0.01)
    return time.perf_counter() - started


async def raw_fleet(bench: BenchBroker, names: list[str]) -> dict[str, Any]:
    """Connect a bare client per agent, publish retained statuses, time a fresh reader."""
    status = json.dumps({"status": ACTIVE, "padding": "x" * 400}).encode()
    clients: list[tuple[str, aiomqtt.Client]] = []
    async with AsyncExitStack() as stack:
        for name in names:
            client = raw_client(bench, name)
            await stack.enter_async_context(client)
            clients.append((name, client))
            await client.publish(topics.status(bench.id(name)), status, qos=1, retain=True)
        broker_rss = rss_mib(bench.broker_pid)
        reader = raw_client(bench, "explorer")
        started = time.perf_counter()
        async with reader:
            await reader.subscribe(STATUS_FILTER, qos=1)
            seen = set()
            async with asyncio.timeout(60):
                async for message in reader.messages:
                    seen.add(message.topic.value)
                    if len(seen) == len(names):
                        break
        elapsed = time.perf_counter() - started
        # Clear the retained statuses, so the VOX fleet's observers never read them.
        for name, client in clients:
            await client.publish(topics.status(bench.id(name)), b"", qos=1, retain=True)
    return {"seconds_to_see_all": round(elapsed, 3), "broker_rss_mib": broker_rss}


async def vox_fleet(bench: BenchBroker, names: list[str], fleet_file: Path) -> dict[str, Any]:
    """Start the fleet in worker processes and time the operator's view of it."""
    console_file = render_agent_config(
        bench.fleet, "operator", bench.root, bench.workdir / "etc" / "operator.toml",
        bench.workdir / "console",
    ).config  # fmt: skip
    total = len(names)

    def all_active(view: FleetView) -> Callable[[], bool]:
        return lambda: active_count(view) >= total

    workers: list[asyncio.subprocess.Process] = []
    try:
        async with fresh_look(console_file) as watcher:
            started = time.perf_counter()
            for index in range(WORKERS):
                workers.append(
                    await spawn_worker(bench, fleet_file, bench.workdir, names[index::WORKERS])
                )
            await poll(all_active(watcher), 180)
            startup = time.perf_counter() - started
        started = time.perf_counter()
        async with fresh_look(console_file) as fresh:
            await poll(all_active(fresh), 60)
            status_seconds = time.perf_counter() - started
        worker_rss = sum(rss_mib(w.pid) for w in workers)
        broker_rss = rss_mib(bench.broker_pid)
    finally:
        await stop_workers(workers)
    return {
        "seconds_to_see_all": round(status_seconds, 3),
        "startup_seconds_until_all_active": round(startup, 3),
        "broker_rss_mib": broker_rss,
        "workers_rss_mib": round(worker_rss, 1),
        "worker_processes": WORKERS,
    }


async def fleet_figures(workdir: Path, agents: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the raw fleet, then the VOX fleet, on one broker."""
    text = fleet_text(tree_shape(agents, 10))
    workdir.mkdir(parents=True, exist_ok=True)
    fleet_file = workdir / "fleet.toml"
    fleet_file.write_text(text)
    with bench_broker(workdir, text) as bench:
        names = [spec.name for spec in bench.fleet]
        raw = await raw_fleet(bench, names)
        vox = await vox_fleet(bench, names, fleet_file)
    return vox, raw


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 6: three rows (idle RSS, idle CPU, fleet view) and the broker's RSS."""
    seconds, agents = sizes(quick)
    idle = daemon_idle.measure(seconds, 15.0, _mkdir(workdir / "idle"))
    vox, raw = asyncio.run(fleet_figures(workdir / "fleet", agents))
    window = idle["seconds"]
    bare_cpu_percent = round(100 * idle["bare_client_cpu_seconds"] / window, 3)
    return [
        figure(
            title="Idle daemon: resident memory (RSS)",
            unit="MiB",
            vox=idle["rss_mib_end"],
            baseline=idle["bare_client_rss_mib"],
            target="none set (baseline: a bare paho client process)",
            met=None,
            detail=idle,
        ),
        figure(
            title=f"Idle daemon: CPU over {window:g} s (% of one core)",
            unit="%",
            vox=idle["cpu_percent_of_one_core"],
            baseline=bare_cpu_percent,
            target="none set (baseline: a bare paho client process)",
            met=None,
        ),
        figure(
            title=f"Fleet of {agents}: a fresh operator console sees all ACTIVE (`vox status`)",
            unit="s",
            vox=vox["seconds_to_see_all"],
            baseline=raw["seconds_to_see_all"],
            target="none set (baseline: a bare subscriber reading as many retained statuses)",
            met=None,
            vox_detail=vox,
            baseline_detail=raw,
        ),
        figure(
            title=f"Fleet of {agents}: broker RSS",
            unit="MiB",
            vox=vox["broker_rss_mib"],
            baseline=raw["broker_rss_mib"],
            target="none set (baseline: the same number of bare clients)",
            met=None,
        ),
    ]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> int:
    """Run figure 6 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
