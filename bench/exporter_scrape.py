"""Figure 11: one `vox exporter` scrape of a fleet of 1,000 agents' retained statuses.

The observer holds 1,000 agent statuses, each with host figures and a full metrics
snapshot (every counter with a few labels, every histogram with counts); a scrape builds
all metric families and renders them with prometheus_client, as `/metrics` does.
Baseline: prometheus_client rendering the same families already built, i.e. the cost of
the exposition format alone. Also timed: the observer taking the 1,000 statuses.

    python -m bench.exporter_scrape [--quick]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bench.common import figure, run_alone
from vox_mqtt.console.exporter import FleetCollector, fleet_families
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import host_metrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize
from vox_mqtt.transport.session import Inbound


def sizes(quick: bool) -> tuple[int, int]:
    """Return (agents, scrapes timed)."""
    return (50, 3) if quick else (1000, 20)


def busy_snapshot() -> dict[str, Any]:
    """Return the snapshot of an agent that has done a bit of everything."""
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
    for gauge in ("inflight_commands", "intake_queue", "ledger_bytes"):
        metrics.gauge(gauge, lambda: 1.0)
    return metrics.snapshot()


def statuses(agents: int) -> list[Inbound]:
    """Return one retained status per agent: a tree with fan-out 10 under the operator."""
    operator = uuid4()
    ids = [uuid4() for _ in range(agents)]
    figures = host_metrics() | {"agent": busy_snapshot()}
    out = []
    for index, agent in enumerate(ids):
        master: UUID = operator if index == 0 else ids[(index - 1) // 10]
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


class _Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 11: scrape time for N agents, against rendering prebuilt families."""
    agents, scrapes = sizes(quick)
    inbound = statuses(agents)
    observer = FleetObserver()
    started = time.perf_counter()
    for message in inbound:
        observer.take(message)
    take_s = time.perf_counter() - started
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(observer))
    body = generate_latest(registry)  # warm-up, and the size of one scrape
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - started)
    static = CollectorRegistry(auto_describe=False)
    static.register(_Static(fleet_families(observer, names={})))
    baseline = []
    for _ in range(scrapes):
        started = time.perf_counter()
        generate_latest(static)
        baseline.append(time.perf_counter() - started)
    vox_ms = statistics.median(times) * 1000
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return figure(
        title=f"vox exporter: one /metrics scrape of {agents} agents' statuses (median)",
        unit="ms",
        vox=vox_ms,
        baseline=statistics.median(baseline) * 1000,
        target="< 1000 ms (well inside Prometheus' default 10 s scrape timeout)",
        met=vox_ms < 1000,
        agents=agents,
        series=series,
        scrape_bytes=len(body),
        observer_take_ms=round(take_s * 1000, 1),
    )


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
