"""Figure 11: one `vox exporter` scrape of a fleet of 10,000 agents' retained statuses.

The observer holds 10,000 agent statuses, each with host figures and a full metrics
snapshot (every counter with a few labels, every histogram with counts). `vox exporter`
keeps each agent's rendered text between scrapes (vox_mqtt/console/exposition.py) and
renders again only what a new status changed, so the figure is a scrape in steady
heartbeats: since the previous scrape every agent sent a new status (new host figures) and
one in ten did some work (its counters and histograms moved). Also timed: the first scrape
(nothing cached), a scrape after every agent worked, the old way (every family rebuilt and
rendered at each scrape), gzip of the body, and the observer taking the statuses.
Baseline: prometheus_client rendering the same families already built, i.e. the cost of
the exposition format alone when nothing is kept.

    python -m bench.exporter_scrape [--quick]
"""

from __future__ import annotations

import gzip
import statistics
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psutil
from prometheus_client import generate_latest

from bench.common import figure, run_alone
from vox_mqtt.console.exporter import FleetCollector, fleet_families
from vox_mqtt.console.exposition import GZIP_LEVEL, CachedExposition, FamilyList
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.selfreport import host_metrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize
from vox_mqtt.transport.session import Inbound

BUSY_SHARE = 10  # one agent in BUSY_SHARE did some work between two scrapes


def sizes(quick: bool) -> tuple[int, int]:
    """Return (agents, steady scrapes timed)."""
    return (50, 3) if quick else (10_000, 5)


def busy_snapshot(work: int = 0) -> dict[str, Any]:
    """Return the snapshot of an agent that has done a bit of everything (more with work)."""
    metrics = AgentMetrics()
    for kind in ("command_request", "command_result", "message_acknowledged", "job_detected"):
        metrics.messages_in.inc(kind, 100)
        metrics.messages_out.inc(kind, 100)
    metrics.rejected.inc("UNAUTHORIZED_SOURCE", 2)
    for code in ("NO_ROUTE", "TIMEOUT", "HANDLER_ERROR"):
        metrics.commands_failed.inc(code, 3)
    for command in ("analyze", "fetch", "summarize"):
        metrics.commands_served.inc(command, 10)
        metrics.commands_delegated.inc(command, 10)
    for histogram in metrics.histograms.values():
        for value in (0.0007, 0.003, 0.02, 0.2, 1.5):
            histogram.observe(value)
    for n in range(work):
        metrics.messages_in.inc("command_request")
        metrics.messages_out.inc("command_result")
        metrics.commands_served.inc("analyze")
        metrics.command_handler_seconds.observe(0.002 * (1 + n % 7))
    for gauge in ("inflight_commands", "intake_queue", "ledger_bytes"):
        metrics.gauge(gauge, lambda: 1.0)
    snapshot = metrics.snapshot()
    assert snapshot is not None  # metrics are on: a snapshot to send
    return snapshot


class Fleet:
    """A tree with fan-out 10 under the operator, and how to make each agent's next status."""

    def __init__(self, agents: int) -> None:
        self.operator = uuid4()
        self.ids = [uuid4() for _ in range(agents)]
        self.work = [0] * agents
        self.beats = 0

    def statuses(self, busy: set[int] | None = None) -> list[Inbound]:
        """Return one retained status per agent; the busy ones did more work than before."""
        self.beats += 1
        base = host_metrics()
        out = []
        snapshots: dict[int, dict[str, Any]] = {}
        for index, agent in enumerate(self.ids):
            if busy is not None and index in busy:
                self.work[index] += 1
            work = self.work[index]
            snapshot = snapshots.get(work)
            if snapshot is None:
                snapshot = snapshots[work] = busy_snapshot(work)
            # Every heartbeat's host figures move: the uptimes, the CPU use.
            figures = base | {
                "uptime_s": base["uptime_s"] + 15 * self.beats,
                "process_uptime_s": 15.0 * self.beats + index,
                "cpu_percent": float((index + self.beats) % 100),
                "agent": snapshot,
            }
            master: UUID = self.operator if index == 0 else self.ids[(index - 1) // 10]
            report = AgentStatus(
                name=f"agent-{index}",
                status="ACTIVE",
                epoch=1,
                started_at="2026-01-01T00:00:00+00:00",
                heartbeat_interval=15.0,
                commands=["analyze"],
                metrics=figures,
            )
            message = new_message(MSG_AGENT_STATUS, source=agent, target=master, details=report)
            out.append(Inbound(topic=topics.status(agent), payload=serialize(message), retain=True))
        return out


def statuses(agents: int) -> list[Inbound]:
    """Return one retained status per agent of a new fleet (tests and profiles use it)."""
    return Fleet(agents).statuses()


def _timed(func: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = func()
    return time.perf_counter() - started, result


def _cpu_timed(func: Any) -> tuple[float, float, Any]:
    """Return (wall s, CPU s of this process, result): the CPU says what a loaded VM hides."""
    cpu_started = time.process_time()
    seconds, result = _timed(func)
    return seconds, time.process_time() - cpu_started, result


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 11: a steady-state scrape of N agents, against rendering built families."""
    agents, scrapes = sizes(quick)
    fleet = Fleet(agents)
    observer = FleetObserver()
    inbound = fleet.statuses()

    def take_all() -> None:
        for message in inbound:
            observer.take(message)

    take_s, _ = _timed(take_all)
    exposition = CachedExposition(observer)
    cold_s, body = _timed(exposition.body)
    steady, steady_cpu = [], []
    for round_ in range(scrapes):
        busy = {i for i in range(agents) if i % BUSY_SHARE == round_ % BUSY_SHARE}
        for message in fleet.statuses(busy):
            observer.take(message)
        seconds, cpu_seconds, body = _cpu_timed(exposition.body)
        steady.append(seconds)
        steady_cpu.append(cpu_seconds)
    for message in fleet.statuses(set(range(agents))):
        observer.take(message)
    all_busy_s, _ = _timed(exposition.body)
    gzip_s, packed = _timed(lambda: gzip.compress(body, compresslevel=GZIP_LEVEL))
    rss_mib = psutil.Process().memory_info().rss / 2**20
    # The old way, and the baseline: prometheus_client rendering built families.
    rebuild_s, _ = _timed(
        lambda: generate_latest(FamilyList([*FleetCollector(observer).collect()]))
    )
    families = fleet_families(observer, names={})
    baseline = [_timed(lambda: generate_latest(FamilyList(families)))[0] for _ in range(2)]
    vox_ms = statistics.median(steady) * 1000
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return figure(
        title=(
            f"vox exporter: one /metrics scrape of {agents} agents in steady heartbeats "
            f"(every agent re-heartbeated, 1 in {BUSY_SHARE} worked; median)"
        ),
        unit="ms",
        vox=vox_ms,
        baseline=statistics.median(baseline) * 1000,
        target="< 1000 ms for 10,000 agents (Prometheus' default scrape timeout is 10 s)",
        met=None if quick else vox_ms < 1000,
        agents=agents,
        series=series,
        scrape_bytes=len(body),
        gzip_level=GZIP_LEVEL,
        gzip_ms=round(gzip_s * 1000, 1),
        gzip_bytes=len(packed),
        first_scrape_ms=round(cold_s * 1000, 1),
        every_agent_worked_scrape_ms=round(all_busy_s * 1000, 1),
        rebuild_every_family_scrape_ms=round(rebuild_s * 1000, 1),
        steady_scrapes_ms=[round(x * 1000, 1) for x in steady],
        steady_scrapes_cpu_ms=[round(x * 1000, 1) for x in steady_cpu],
        observer_take_ms=round(take_s * 1000, 1),
        observer_take_ms_per_status=round(take_s * 1000 / agents, 3),
        bench_process_rss_mib=round(rss_mib, 1),
    )


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
