"""Figure 3: concurrent commands per second through root -> coordinator -> two specialists.

VOX: C workers in the operator keep one `echo` each in flight for a fixed time; the root
delegates to the coordinator, which spreads them over both specialists (least busy first).
Every agent keeps its ledger (synchronous=FULL, group commit). Raw: the same tree of bare
clients with the same concurrency, the coordinator alternating between the specialists.
Besides the rate, the CPU time this process (every agent and the load generator) and the
broker spent per command, and a cProfile of a separate VOX run: where the time goes.

    python -m bench.throughput [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.common import SEED_SHAPE, BenchBroker, bench_broker, figure, fleet_text, run_alone
from bench.profiling import summarize
from bench.rawmqtt import RawNode
from bench.voxside import start_vox
from vox_mqtt.agent.facade import VOXAgent

PARAMS = {"text": "hello"}
# A command through three levels: three requests and three answers, each acknowledged.
MESSAGES_PER_COMMAND = 12
TREE = {
    "operator": (None, ("root",)),
    "root": ("operator", ("coordinator",)),
    "coordinator": ("root", ("spec_a", "spec_b")),
    "spec_a": ("coordinator", ()),
    "spec_b": ("coordinator", ()),
}


def sizes(quick: bool) -> tuple[int, float, float]:
    """Return (concurrency, seconds per side, seconds profiled)."""
    return (8, 1.0, 1.0) if quick else (32, 10.0, 5.0)


async def drive(call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float) -> float:
    """Keep `concurrency` calls in flight for `seconds`; return completed calls per second."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


class CpuMeter:
    """CPU seconds used by this process and by the broker between start() and stop()."""

    def __init__(self, broker_pid: int) -> None:
        self.me, self.broker = psutil.Process(), psutil.Process(broker_pid)
        self.started = (0.0, 0.0)

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return times.user + times.system

    def start(self) -> None:
        """Take the first reading."""
        self.started = (self._cpu(self.me), self._cpu(self.broker))

    def stop(self) -> tuple[float, float]:
        """Return (this process, broker) CPU seconds since start()."""
        return (
            self._cpu(self.me) - self.started[0],
            self._cpu(self.broker) - self.started[1],
        )


async def raw_rate(bench: BenchBroker, concurrency: int, seconds: float) -> dict[str, Any]:
    """Measure the raw tree's request rate and CPU per request."""
    async with AsyncExitStack() as stack:
        nodes = {
            name: await stack.enter_async_context(
                RawNode(bench, name, master=master, children=children)
            )
            for name, (master, children) in TREE.items()
        }
        root = bench.id("root")

        async def call() -> None:
            await nodes["operator"].request(root, PARAMS)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        return await _metered(bench, call, concurrency, seconds)


async def _metered(
    bench: BenchBroker, call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float
) -> dict[str, Any]:
    meter = CpuMeter(bench.broker_pid)
    meter.start()
    rate = await drive(call, concurrency, seconds)
    mine, broker = meter.stop()
    count = rate * seconds
    return {
        "commands_per_second": round(rate, 1),
        "cpu_ms_per_command_python": round(1000 * mine / count, 3),
        "cpu_ms_per_command_broker": round(1000 * broker / count, 3),
    }


async def vox_rate(
    bench: BenchBroker, concurrency: int, seconds: float, profile_seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure the VOX tree's command rate, then profile a second run of it."""
    async with AsyncExitStack() as stack:
        operator, agents = await start_vox(
            stack, bench, ["root", "coordinator", "spec_a", "spec_b"]
        )
        root = bench.id("root")

        async def call() -> None:
            await operator.request("echo", PARAMS, to=root)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        result = await _metered(bench, call, concurrency, seconds)
        served = {n: await _count_served(agents[n]) for n in ("spec_a", "spec_b")}
        result["served_by_specialist"] = served
        profiler = cProfile.Profile()
        profiler.enable()
        profiled_rate = await drive(call, concurrency, profile_seconds)
        profiler.disable()
    profile = summarize(profiler)
    profile["commands_per_second_under_profiler"] = round(profiled_rate, 1)
    return result, profile


async def _count_served(agent: VOXAgent) -> int:
    """Count the commands an agent ran to completion, from its ledger."""
    with contextlib.closing(sqlite3.connect(agent.memory.path)) as db:
        found = db.execute("SELECT COUNT(*) FROM logs WHERE action = 'completed'").fetchone()
    return int(found[0])


async def measure(workdir: Path, quick: bool) -> dict[str, Any]:
    """Run both sides on one broker, raw first."""
    concurrency, seconds, profile_seconds = sizes(quick)
    with bench_broker(workdir, fleet_text(SEED_SHAPE)) as bench:
        raw = await raw_rate(bench, concurrency, seconds)
        vox, profile = await vox_rate(bench, concurrency, seconds, profile_seconds)
    ratio = vox["commands_per_second"] / raw["commands_per_second"]
    vox["cpu_ms_per_message_python"] = round(
        vox["cpu_ms_per_command_python"] / MESSAGES_PER_COMMAND, 3
    )
    return figure(
        title="Throughput: concurrent commands/s through root -> coordinator -> 2 specialists",
        unit="commands/s",
        vox=vox["commands_per_second"],
        baseline=raw["commands_per_second"],
        target="VOX >= 0.5 x raw",
        met=ratio >= 0.5,
        higher_is_better=True,
        concurrency=concurrency,
        seconds=seconds,
        vox_detail=vox,
        baseline_detail=raw,
        profile=profile,
    )


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 3 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 3 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
