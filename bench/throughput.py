"""Figure 3: concurrent commands per second through root -> coordinator -> two specialists.

VOX: C workers in the operator keep one `echo` each in flight for a fixed time; the root
delegates to the coordinator, which spreads them over both specialists (least busy first).
Every agent keeps its ledger (synchronous=FULL, group commit). Raw: the same tree of bare
clients with the same concurrency, the coordinator alternating between the specialists.
Besides the rate, the CPU time this process (every agent and the load generator) and the
broker spent per command, and a cProfile of a separate VOX run: where the time goes.
VOX runs twice against the same raw baseline: all-in-one (every agent in this process), then
process per agent (a `vox-agent` daemon each, bench/deployed.py), whose CPU per command sums
every daemon's and this process's (the operator's and the load generator's).

    python -m bench.throughput [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.common import SEED_SHAPE, BenchBroker, bench_broker, figure, fleet_text, run_alone
from bench.deployed import cpu_seconds, start_deployed
from bench.one_hop import ALL_IN_ONE, PER_PROCESS, titled
from bench.profiling import summarize
from bench.rawmqtt import RAW_CLIENTS, GroupJournal, RawNode
from bench.voxside import seed_role_specs, start_vox

PARAMS = {"text": "hello"}
# A command through three levels: three requests and three answers; no answer is
# acknowledged, and the specialist's quick answer stands for its request's acknowledgement,
# so only the two relays acknowledge their request (docs/messages.md).
MESSAGES_PER_COMMAND = 8
# The raw relays' command: three requests and three responses, nothing acknowledged.
RAW_MESSAGES_PER_COMMAND = 6
AGENTS = ["root", "coordinator", "spec_a", "spec_b"]
SPECIALISTS = ("spec_a", "spec_b")
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
    """CPU seconds used by this process, the broker and agent processes between start and stop."""

    def __init__(self, broker_pid: int, agent_pids: tuple[int, ...] = ()) -> None:
        self.pids = (os.getpid(), broker_pid)
        self.agent_pids = agent_pids
        self.started = (0.0, 0.0, 0.0)

    def _read(self) -> tuple[float, float, float]:
        me, broker = self.pids
        return cpu_seconds([me]), cpu_seconds([broker]), cpu_seconds(self.agent_pids)

    def start(self) -> None:
        """Take the first reading."""
        self.started = self._read()

    def stop(self) -> tuple[float, float, float]:
        """Return (this process, broker, agent processes) CPU seconds since start()."""
        now = self._read()
        mine, broker, agents = (
            after - before for after, before in zip(now, self.started, strict=True)
        )
        return mine, broker, agents


async def raw_tree(
    stack: AsyncExitStack,
    bench: BenchBroker,
    journal: Callable[[str], GroupJournal | None],
    client: str,
) -> dict[str, RawNode]:
    """Start figure 3's raw tree (TREE), each node with the journal made for its name."""
    return {
        name: await stack.enter_async_context(
            RawNode(
                bench, name, master=master, children=children, journal=journal(name), client=client
            )
        )
        for name, (master, children) in TREE.items()
    }


async def raw_rate(
    bench: BenchBroker,
    concurrency: int,
    seconds: float,
    *,
    durable: bool = False,
    client: str = "aiomqtt",
) -> dict[str, Any]:
    """Measure the raw tree's request rate and CPU per request.

    durable: each node also acknowledges and commits as a VOX hop must, its commits grouped
    per turn of the loop (rawmqtt.GroupJournal): the guarantees' own price under load.
    """

    def journal(name: str) -> GroupJournal | None:
        return GroupJournal(bench.workdir / f"journal-3-{name}.db") if durable else None

    async with AsyncExitStack() as stack:
        nodes = await raw_tree(stack, bench, journal, client)
        root = bench.id("root")

        async def call() -> None:
            await nodes["operator"].request(root, PARAMS)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        return await _metered(bench, call, concurrency, seconds)


async def _metered(
    bench: BenchBroker,
    call: Callable[[], Awaitable[Any]],
    concurrency: int,
    seconds: float,
    agent_pids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Drive the calls and meter CPU; with agent_pids, python CPU is theirs plus this one's."""
    meter = CpuMeter(bench.broker_pid, agent_pids)
    meter.start()
    rate = await drive(call, concurrency, seconds)
    mine, broker, agents = meter.stop()
    count = rate * seconds
    result = {
        "commands_per_second": round(rate, 1),
        "cpu_ms_per_command_python": round(1000 * (mine + agents) / count, 3),
        "cpu_ms_per_command_broker": round(1000 * broker / count, 3),
    }
    if agent_pids:
        result["cpu_ms_per_command_operator"] = round(1000 * mine / count, 3)
        result["cpu_ms_per_command_agents"] = round(1000 * agents / count, 3)
        result["agent_processes"] = len(agent_pids)
    return result


async def vox_rate(
    bench: BenchBroker, concurrency: int, seconds: float, profile_seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure the all-in-one VOX tree's command rate, then profile a second run of it."""
    ledgers = {n: bench.agent_config(n).state_dir / "logs.db" for n in SPECIALISTS}
    async with AsyncExitStack() as stack:
        operator, _ = await start_vox(stack, bench, AGENTS)
        root = bench.id("root")

        async def call() -> None:
            await operator.request("echo", PARAMS, to=root)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        result = await _metered(bench, call, concurrency, seconds)
        result["served_by_specialist"] = {n: _count_served(path) for n, path in ledgers.items()}
        profiler = cProfile.Profile()
        profiler.enable()
        profiled_rate = await drive(call, concurrency, profile_seconds)
        profiler.disable()
    profile = summarize(profiler)
    profile["commands_per_second_under_profiler"] = round(profiled_rate, 1)
    profile["loop_turns_per_command"] = round(
        profile["loop_turns"] / max(1.0, profiled_rate * profile_seconds), 1
    )
    return result, profile


async def deployed_rate(bench: BenchBroker, concurrency: int, seconds: float) -> dict[str, Any]:
    """Measure the command rate with every agent in its own daemon, CPU summed over them all."""
    # The daemons go on with the ledgers of the all-in-one run: count only their own work.
    ledgers = {n: bench.agent_config(n).state_dir / "logs.db" for n in SPECIALISTS}
    before = {n: _count_served(path) for n, path in ledgers.items()}
    async with AsyncExitStack() as stack:
        operator, daemons = await start_deployed(stack, bench, AGENTS)
        root = bench.id("root")

        async def call() -> None:
            await operator.request("echo", PARAMS, to=root)

        await drive(call, concurrency, min(seconds, 1.0))  # warm-up
        pids = tuple(d.pid for d in daemons.values())
        result = await _metered(bench, call, concurrency, seconds, agent_pids=pids)
        result["served_by_specialist"] = {
            n: _count_served(path) - before[n] for n, path in ledgers.items()
        }
    return result


def _count_served(ledger: Path) -> int:
    """Count the commands an agent ran to completion, from its ledger (0 before it exists)."""
    if not ledger.exists():
        return 0
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        found = db.execute("SELECT COUNT(*) FROM logs WHERE action = 'completed'").fetchone()
    return int(found[0])


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Run raw, then VOX all-in-one, then VOX process per agent, on one broker."""
    concurrency, seconds, profile_seconds = sizes(quick)
    with bench_broker(workdir, fleet_text(SEED_SHAPE, roles=seed_role_specs())) as bench:
        # Each raw client in turn; the faster one is the baseline (bench/rawmqtt.py).
        by_client = {
            name: await raw_rate(bench, concurrency, seconds, client=name) for name in RAW_CLIENTS
        }
        fastest = max(by_client, key=lambda name: by_client[name]["commands_per_second"])
        raw = by_client[fastest]
        floor = await raw_rate(bench, concurrency, seconds, durable=True, client=fastest)
        vox, profile = await vox_rate(bench, concurrency, seconds, profile_seconds)
        deployed = await deployed_rate(bench, concurrency, seconds)
    title = "Throughput: concurrent commands/s through root -> coordinator -> 2 specialists"
    rows = []
    for layout, detail in ((ALL_IN_ONE, vox), (PER_PROCESS, deployed)):
        detail["cpu_ms_per_message_python"] = round(
            detail["cpu_ms_per_command_python"] / MESSAGES_PER_COMMAND, 3
        )
        raw["cpu_ms_per_message_python"] = round(
            raw["cpu_ms_per_command_python"] / RAW_MESSAGES_PER_COMMAND, 3
        )
        detail["cpu_per_message_ratio"] = round(
            detail["cpu_ms_per_message_python"] / raw["cpu_ms_per_message_python"], 2
        )
        extra = {"profile": profile} if layout == ALL_IN_ONE else {}
        rows.append(
            figure(
                title=titled(title, layout),
                unit="commands/s",
                vox=detail["commands_per_second"],
                baseline=raw["commands_per_second"],
                # Judged against the floor of the same run (docs/performance.md).
                target="VOX >= 0.95 x the obligations floor",
                met=detail["commands_per_second"] >= 0.95 * floor["commands_per_second"],
                higher_is_better=True,
                layout=layout,
                concurrency=concurrency,
                seconds=seconds,
                vox_detail=detail,
                baseline_detail=raw,
                baseline_client=fastest,
                baseline_rate_by_client={k: v["commands_per_second"] for k, v in by_client.items()},
                # Raw clients that acknowledge and commit as a hop must: the guarantees' price.
                obligations_detail=floor,
                obligations_ratio=round(
                    floor["commands_per_second"] / raw["commands_per_second"], 2
                ),
                vox_over_obligations=round(
                    detail["commands_per_second"] / floor["commands_per_second"], 2
                ),
                **extra,
            )
        )
    return rows


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 3 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 3 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
