"""The fleet's Prometheus metrics, built at scrape time from what an observer has read.

`FleetCollector` is a prometheus_client collector: every scrape turns the retained
statuses and war-room posts a `FleetObserver` holds into metric families (docs/metrics.md
says what each one means). Nothing is kept between scrapes but the war-room series seen
before, so a resolved incident reads 0 rather than vanishing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final
from uuid import UUID

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from vox_mqtt.observe.metrics import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    MetricsSnapshot,
    parse_host_metrics,
    parse_snapshot,
)
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, INACTIVE, STALE, AgentLiveness
from vox_mqtt.observe.warroom import INCIDENT_CODE

__all__ = [
    "HOST_FAMILIES",
    "INVALID_CODE",
    "STATES",
    "WARROOM_SERIES_KEEP",
    "FleetCollector",
    "code_label",
    "fleet_families",
    "warroom_series",
]

# An agent the exporter lists has sent a status, so it is never UNKNOWN.
STATES: Final = (ACTIVE, STALE, INACTIVE)
AGENT_LABELS: Final = ("agent", "id", "master")
# Heartbeat host figure -> (metric name, help). Per agent: agents may share a host.
HOST_FAMILIES: Final[Mapping[str, tuple[str, str]]] = {
    "cpu_percent": ("vox_host_cpu_percent", "host CPU use, percent, over the last interval"),
    "memory_percent": ("vox_host_memory_percent", "host memory in use, percent"),
    "disk_percent": ("vox_host_disk_percent", "use of the disk holding the agent's state"),
    "load_1m": ("vox_host_load1", "host load average over one minute"),
    "uptime_s": ("vox_host_uptime_seconds", "seconds since the host booted"),
    "process_rss_bytes": (
        "vox_agent_process_resident_memory_bytes",
        "resident memory of the agent process",
    ),
    "process_cpu_percent": (
        "vox_agent_process_cpu_percent",
        "agent process CPU use, percent, over the last interval",
    ),
    "process_uptime_s": (
        "vox_agent_process_uptime_seconds",
        "seconds since the agent process started",
    ),
}
# A (severity, code) pair no post holds any more reads 0 for this long, then is dropped;
# at most this many such pairs are remembered, the longest closed dropped first
# (docs/metrics.md).
WARROOM_SERIES_KEEP: Final = 900.0
_MAX_WARROOM_SERIES: Final = 256
# The code label of a post whose error_code is not an incident code (INCIDENT_CODE).
INVALID_CODE: Final = "INVALID_CODE"
Pair = tuple[str, str]


def code_label(code: str) -> str:
    """Return a war-room error_code as a label value: itself if a valid code, else INVALID_CODE."""
    return code if INCIDENT_CODE.fullmatch(code) else INVALID_CODE


def warroom_series(
    open_counts: Mapping[Pair, int],
    remembered: dict[Pair, float],
    now: float,
    *,
    keep: float = WARROOM_SERIES_KEEP,
    cap: int = _MAX_WARROOM_SERIES,
) -> dict[Pair, int]:
    """Return the series to report: every open pair, and the recently closed ones as 0.

    remembered (pair -> when it was last open) is updated in place: open pairs now, a
    pair closed longer than keep is dropped, and beyond cap closed pairs the longest
    closed go first. Pure: the clock is an argument.
    """
    for pair in open_counts:
        remembered[pair] = now
    for pair, at in list(remembered.items()):
        if pair not in open_counts and now - at > keep:
            del remembered[pair]
    closed = sorted((at, pair) for pair, at in remembered.items() if pair not in open_counts)
    for _, pair in closed[: max(0, len(closed) - cap)]:
        del remembered[pair]
    series = {pair: 0 for pair in remembered}
    series.update(open_counts)
    return series


Parsed = tuple[dict[str, Any], dict[str, float], MetricsSnapshot | None]


def _parsed(entry: AgentLiveness, cache: dict[UUID, Parsed] | None) -> Parsed:
    """Return an agent's host figures and snapshot, parsed once per status received."""
    raw = entry.metrics or {}
    if cache is not None:
        hit = cache.get(entry.id)
        if hit is not None and hit[0] is raw:
            return hit
    parsed = (raw, parse_host_metrics(raw), parse_snapshot(raw.get("agent")))
    if cache is not None:
        cache[entry.id] = parsed
    return parsed


def fleet_families(
    observer: FleetObserver,
    *,
    names: Mapping[UUID, str],
    seen_incidents: dict[Pair, float] | None = None,
    cache: dict[UUID, Parsed] | None = None,
) -> list[Metric]:
    """Return every metric family for the agents and incidents the observer holds."""
    observer.view.refresh()  # an agent whose heartbeat is too old is STALE at this scrape
    agents = [a for a in observer.view.agents() if a.seen]
    by_id = {a.id: a.name for a in agents}

    def labels(entry: AgentLiveness) -> list[str]:
        master = entry.master_id
        if master is None:
            master_name = ""
        else:
            master_name = by_id.get(master) or names.get(master) or str(master)
        return [entry.name, str(entry.id), master_name]

    up = GaugeMetricFamily("vox_agent_up", "1 if the agent is ACTIVE, else 0", labels=AGENT_LABELS)
    state = GaugeMetricFamily(
        "vox_agent_status", "1 for the agent's liveness state", labels=[*AGENT_LABELS, "state"]
    )
    age = GaugeMetricFamily(
        "vox_agent_heartbeat_age_seconds",
        "seconds since the agent's last status, on the exporter's clock",
        labels=AGENT_LABELS,
    )
    interval = GaugeMetricFamily(
        "vox_agent_heartbeat_interval_seconds",
        "the heartbeat interval the agent announces",
        labels=AGENT_LABELS,
    )
    epoch = GaugeMetricFamily(
        "vox_agent_epoch", "the agent's connection counter (+1 per connection)", labels=AGENT_LABELS
    )
    counters = {
        name: CounterMetricFamily(
            f"vox_agent_{name}",
            spec.help,
            labels=[*AGENT_LABELS, *([spec.label] if spec.label else [])],
        )
        for name, spec in COUNTERS.items()
    }
    gauges = {
        name: GaugeMetricFamily(f"vox_agent_{name}", help, labels=AGENT_LABELS)
        for name, help in GAUGES.items()
    }
    histograms = {
        name: HistogramMetricFamily(f"vox_agent_{name}", help, labels=AGENT_LABELS)
        for name, help in HISTOGRAMS.items()
    }
    host = {
        key: GaugeMetricFamily(name, help, labels=AGENT_LABELS)
        for key, (name, help) in HOST_FAMILIES.items()
    }
    for entry in agents:
        base = labels(entry)
        up.add_metric(base, 1.0 if entry.status == ACTIVE else 0.0)
        for each in STATES:
            state.add_metric([*base, each], 1.0 if entry.status == each else 0.0)
        heartbeat_age = entry.heartbeat_age()
        if heartbeat_age is not None:
            age.add_metric(base, round(heartbeat_age, 3))
        interval.add_metric(base, entry.heartbeat_interval)
        epoch.add_metric(base, float(entry.epoch))
        _, figures, snapshot = _parsed(entry, cache)
        for key, value in figures.items():
            host[key].add_metric(base, value)
        if snapshot is None:
            continue
        for name, values in snapshot.counters.items():
            family = counters[name]
            if COUNTERS[name].label is None:
                family.add_metric(base, float(values.get("", 0)))
            else:
                for label, value in values.items():
                    family.add_metric([*base, label], float(value))
        for name, number in snapshot.gauges.items():
            gauges[name].add_metric(base, number)
        for name, hist in snapshot.histograms.items():
            histograms[name].add_metric(
                base, buckets=[(le, float(n)) for le, n in hist.cumulative()], sum_value=hist.sum
            )
    families: list[Metric] = [up, state, age, interval, epoch]
    families += [*counters.values(), *gauges.values(), *histograms.values(), *host.values()]
    families.append(_warroom(observer, seen_incidents))
    return families


def _warroom(observer: FleetObserver, seen: dict[Pair, float] | None) -> Metric:
    family = GaugeMetricFamily(
        "vox_warroom_open_incidents",
        "open war-room incidents, by severity and error code",
        labels=["severity", "code"],
    )
    counts: dict[Pair, int] = {}
    for incident in observer.incidents.values():
        key: Pair = (str(incident.failure.severity), code_label(incident.failure.error_code))
        counts[key] = counts.get(key, 0) + 1
    if seen is not None:
        counts = warroom_series(counts, seen, time.monotonic())
    for (severity, code), n in sorted(counts.items()):
        family.add_metric([severity, code], float(n))
    return family


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class FleetCollector(Collector):
    """Yield the fleet's metric families at each scrape, built on the observer's loop."""

    def __init__(
        self,
        observer: FleetObserver,
        *,
        names: Mapping[UUID, str] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        connected: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.observer = observer
        self.names = dict(names or {})
        self.loop = loop
        self.connected = connected
        self.timeout = timeout
        self._seen: dict[Pair, float] = {}
        # A status's metrics are parsed at the first scrape after it arrived, not at each.
        self._cache: dict[UUID, Parsed] = {}
        self._lock = threading.Lock()

    def _build(self) -> list[Metric]:
        families = fleet_families(
            self.observer, names=self.names, seen_incidents=self._seen, cache=self._cache
        )
        if self.connected is not None:
            link = GaugeMetricFamily(
                "vox_exporter_broker_connected",
                "1 while the exporter's read-only session to the broker is up",
            )
            link.add_metric([], 1.0 if self.connected() else 0.0)
            families.append(link)
        return families

    def collect(self) -> Iterable[Metric]:
        """Build the families; on the observer's event loop when it runs in another thread."""
        with self._lock:
            loop = self.loop
            if loop is None or not loop.is_running() or _running_loop() is loop:
                return self._build()

            async def build() -> list[Metric]:
                return self._build()

            # The HTTP server scrapes from its own thread; the observer's dicts change on
            # the loop's thread, so the snapshot is taken there, between two messages.
            return asyncio.run_coroutine_threadsafe(build(), loop).result(self.timeout)
