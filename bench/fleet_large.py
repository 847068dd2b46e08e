"""Figure 9: a fleet of 1,000 agents on one broker.

1,000 agents (a tree with fanout 10, heartbeat every 15 s; 40 every 2 s with --quick)
run as in-process VOXAgents spread over worker processes (`bench.fleet_worker`).
Measured once all are up:
- how long a fresh operator console (what `vox status` does) takes to see all ACTIVE;
- the broker's RSS and CPU (% of one core) over a window of steady heartbeats;
- heartbeat messages per second the broker delivered to one `vox/+/status` reader.

    python -m bench.fleet_large [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt
import psutil

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
    workers_ready,
)
from bench.footprint import poll, rss_mib
from bench.rawmqtt import raw_client
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.observe.status import FleetView
from vox_mqtt.protocol import topics

WORKERS = 4


def sizes(quick: bool) -> tuple[int, float, float]:
    """Return (agents, heartbeat interval, steady window), all in seconds but the first."""
    return (40, 2.0, 5.0) if quick else (1000, 15.0, 60.0)


async def _count_statuses(bench: BenchBroker, window: float) -> int:
    """Return how many live status messages one reader received during the window."""
    reader: aiomqtt.Client = raw_client(bench, "explorer")
    count = 0
    async with reader:
        await reader.subscribe(topics.STATUS_FILTER, qos=1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window):
                async for message in reader.messages:
                    # Retained copies arrive flagged at subscribe time: only live traffic counts.
                    if not message.retain:
                        count += 1
    return count


async def measure(workdir: Path, agents: int, heartbeat: float, window: float) -> dict[str, Any]:
    """Start the fleet, time a fresh console's view, then sample the broker in steady state."""
    text = fleet_text(tree_shape(agents, 10), heartbeat=heartbeat)
    workdir.mkdir(parents=True, exist_ok=True)
    fleet_file = workdir / "fleet.toml"
    fleet_file.write_text(text)
    with bench_broker(workdir, text) as bench:
        names = [spec.name for spec in bench.fleet]
        console_file = render_agent_config(
            bench.fleet, "operator", bench.root, workdir / "etc" / "operator.toml",
            workdir / "console",
        ).config  # fmt: skip

        def all_active(view: FleetView) -> Callable[[], bool]:
            return lambda: active_count(view) >= agents

        workers: list[asyncio.subprocess.Process] = []
        try:
            started = time.perf_counter()
            for index in range(WORKERS):
                workers.append(
                    await spawn_worker(
                        bench, fleet_file, workdir, names[index::WORKERS],
                        "--heartbeat", str(heartbeat),
                    )
                )  # fmt: skip
            await workers_ready(workers, 600)
            startup = time.perf_counter() - started
            started = time.perf_counter()
            async with fresh_look(console_file) as fresh:
                await poll(all_active(fresh), 120)
                status_seconds = time.perf_counter() - started
            broker = psutil.Process(bench.broker_pid)
            cpu_before = broker.cpu_times()
            sampled = time.perf_counter()
            heartbeats = await _count_statuses(bench, window)
            cpu_after = broker.cpu_times()
            elapsed = time.perf_counter() - sampled
            busy = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
            broker_rss = rss_mib(bench.broker_pid)
            workers_rss = sum(rss_mib(w.pid) for w in workers)
        finally:
            await stop_workers(workers)
    return {
        "agents": agents,
        "startup_seconds_until_all_ready": round(startup, 1),
        "fresh_status_seconds_to_see_all_active": round(status_seconds, 3),
        "broker_rss_mib": broker_rss,
        "broker_cpu_percent_of_one_core": round(100 * busy / elapsed, 2),
        "heartbeat_messages_per_second": round(heartbeats / window, 1),
        "expected_heartbeats_per_second": round(agents / heartbeat, 1),
        "heartbeat_interval": heartbeat,
        "window_seconds": window,
        "workers_rss_mib": round(workers_rss, 1),
        "worker_processes": WORKERS,
    }


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 9: fresh view time, broker RSS and CPU, heartbeat rate."""
    agents, heartbeat, window = sizes(quick)
    detail = asyncio.run(measure(workdir, agents, heartbeat, window))
    common = {"target": "none set", "met": None}
    return [
        figure(
            title=f"{agents} agents on one broker: a fresh `vox status` sees all ACTIVE",
            unit="s",
            vox=detail["fresh_status_seconds_to_see_all_active"],
            baseline=0.0,
            detail=detail,
            **common,  # type: ignore[arg-type]
        ),
        figure(
            title=f"{agents} agents on one broker: broker RSS",
            unit="MiB",
            vox=detail["broker_rss_mib"],
            baseline=0.0,
            **common,  # type: ignore[arg-type]
        ),
        figure(
            title=f"{agents} agents on one broker: broker CPU in steady heartbeats (% of a core)",
            unit="%",
            vox=detail["broker_cpu_percent_of_one_core"],
            baseline=0.0,
            **common,  # type: ignore[arg-type]
        ),
        figure(
            title=f"{agents} agents on one broker: heartbeat messages/s (vs agents / interval)",
            unit="msg/s",
            vox=detail["heartbeat_messages_per_second"],
            baseline=detail["expected_heartbeats_per_second"],
            higher_is_better=True,
            **common,  # type: ignore[arg-type]
        ),
    ]


def main() -> int:
    """Run figure 9 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
