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
from dataclasses import dataclass
from typing import Any, Final, TypeVar
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
from vox_mqtt.observe.status import ACTIVE, INACTIVE, STALE
from vox_mqtt.observe.warroom import INCIDENT_CODE
from vox_mqtt.observe.warroomreplay import NOT_NEWER
from vox_mqtt.protocol.signing import STALE as STALE_POST

__all__ = [
    "HOST_FAMILIES",
    "INVALID_CODE",
    "REPLAY_REASONS",
    "STATES",
    "WARROOM_SERIES_KEEP",
    "FleetCollector",
    "code_label",
    "fleet_families",
    "link_families",
    "observer_families",
    "on_loop",
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
# Why a war-room post was not taken (FleetObserver.replays): vox_warroom_replays_total{reason}.
REPLAY_REASONS: Final = (STALE_POST, NOT_NEWER)
# The code label of a post whose error_code is not an incident code (INCIDENT_CODE).
INVALID_CODE: Final = "INVALID_CODE"
Pair = tuple[str, str]
T = TypeVar("T")


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


@dataclass(frozen=True, slots=True)
class AgentRow:
    """What one scrape reports of one agent, read on the observer's loop."""

    id: UUID
    labels: tuple[str, str, str]  # AGENT_LABELS: name, id, master's name
    status: str
    interval: float
    epoch: int
    age: float | None  # seconds since its last status, on the exporter's clock
    metrics: dict[str, Any]  # the status's details.metrics as received (never changed after)


def agent_rows(
    observer: FleetObserver, names: Mapping[UUID, str], now: float | None = None
) -> list[AgentRow]:
    """Return a row per agent that has sent a status, STALE ones marked as of now."""
    observer.view.refresh()  # an agent whose heartbeat is too old is STALE at this scrape
    agents = [a for a in observer.view.agents() if a.seen]
    by_id = {a.id: a.name for a in agents}
    now = time.monotonic() if now is None else now
    rows = []
    for entry in agents:
        master = entry.master_id
        if master is None:
            master_name = ""
        else:
            master_name = by_id.get(master) or names.get(master) or str(master)
        rows.append(
            AgentRow(
                id=entry.id,
                labels=(entry.name, str(entry.id), master_name),
                status=entry.status,
                interval=entry.heartbeat_interval,
                epoch=entry.epoch,
                age=entry.heartbeat_age(now),
                metrics=entry.metrics or {},
            )
        )
    return rows


def _parsed(row: AgentRow, cache: dict[UUID, Parsed] | None) -> Parsed:
    """Return an agent's host figures and snapshot, parsed once per status received."""
    raw = row.metrics
    if cache is not None:
        hit = cache.get(row.id)
        if hit is not None and hit[0] is raw:
            return hit
    parsed = (raw, parse_host_metrics(raw), parse_snapshot(raw.get("agent")))
    if cache is not None:
        cache[row.id] = parsed
    return parsed


# The groups of an agent's families that change for different reasons (the cached
# exposition renders a group again only when its inputs changed: docs/metrics.md).
LIVENESS: Final = "liveness"  # up, status, interval, epoch: change with the status itself
AGE: Final = "age"  # changes at every scrape
HOST: Final = "host"  # the host figures: change with every heartbeat
COUNTERS_GROUP: Final = "counters"
GAUGES_GROUP: Final = "gauges"
HISTOGRAMS_GROUP: Final = "histograms"
GROUPS: Final = (LIVENESS, AGE, COUNTERS_GROUP, GAUGES_GROUP, HISTOGRAMS_GROUP, HOST)


def family_keys() -> list[tuple[str, str]]:
    """Return (group, key) of every per-agent family, in the order a scrape lists them."""
    keys = [(LIVENESS, "up"), (LIVENESS, "status"), (AGE, "age")]
    keys += [(LIVENESS, "interval"), (LIVENESS, "epoch")]
    keys += [(COUNTERS_GROUP, name) for name in COUNTERS]
    keys += [(GAUGES_GROUP, name) for name in GAUGES]
    keys += [(HISTOGRAMS_GROUP, name) for name in HISTOGRAMS]
    keys += [(HOST, key) for key in HOST_FAMILIES]
    return keys


def new_family(group: str, key: str) -> Metric:
    """Return the empty metric family of one (group, key) of family_keys()."""
    if group in (LIVENESS, AGE):
        name, help = {
            "up": ("vox_agent_up", "1 if the agent is ACTIVE, else 0"),
            "status": ("vox_agent_status", "1 for the agent's liveness state"),
            "age": (
                "vox_agent_heartbeat_age_seconds",
                "seconds since the agent's last status, on the exporter's clock",
            ),
            "interval": (
                "vox_agent_heartbeat_interval_seconds",
                "the heartbeat interval the agent announces",
            ),
            "epoch": ("vox_agent_epoch", "the agent's connection counter (+1 per connection)"),
        }[key]
        labels = [*AGENT_LABELS, "state"] if key == "status" else list(AGENT_LABELS)
        return GaugeMetricFamily(name, help, labels=labels)
    if group == COUNTERS_GROUP:
        spec = COUNTERS[key]
        extra = [spec.label] if spec.label else []
        return CounterMetricFamily(f"vox_agent_{key}", spec.help, labels=[*AGENT_LABELS, *extra])
    if group == GAUGES_GROUP:
        return GaugeMetricFamily(f"vox_agent_{key}", GAUGES[key], labels=AGENT_LABELS)
    if group == HISTOGRAMS_GROUP:
        return HistogramMetricFamily(f"vox_agent_{key}", HISTOGRAMS[key], labels=AGENT_LABELS)
    name, help = HOST_FAMILIES[key]
    return GaugeMetricFamily(name, help, labels=AGENT_LABELS)


def add_agent(
    families: Mapping[tuple[str, str], Metric],
    row: AgentRow,
    figures: Mapping[str, float],
    snapshot: MetricsSnapshot | None,
) -> None:
    """Add one agent's samples to those of the families given (the others are left out)."""
    base = list(row.labels)

    def family(group: str, key: str) -> Any:
        # Any: each family is the kind new_family made for its key, with its add_metric.
        return families.get((group, key))

    if (up := family(LIVENESS, "up")) is not None:
        up.add_metric(base, 1.0 if row.status == ACTIVE else 0.0)
    if (state := family(LIVENESS, "status")) is not None:
        for each in STATES:
            state.add_metric([*base, each], 1.0 if row.status == each else 0.0)
    if (age := family(AGE, "age")) is not None and row.age is not None:
        age.add_metric(base, round(row.age, 3))
    if (interval := family(LIVENESS, "interval")) is not None:
        interval.add_metric(base, row.interval)
    if (epoch := family(LIVENESS, "epoch")) is not None:
        epoch.add_metric(base, float(row.epoch))
    for key, value in figures.items():
        if (host := family(HOST, key)) is not None:
            host.add_metric(base, value)
    if snapshot is None:
        return
    for name, values in snapshot.counters.items():
        if (counter := family(COUNTERS_GROUP, name)) is None:
            continue
        if COUNTERS[name].label is None:
            counter.add_metric(base, float(values.get("", 0)))
        else:
            for label, value in values.items():
                counter.add_metric([*base, label], float(value))
    for name, number in snapshot.gauges.items():
        if (gauge := family(GAUGES_GROUP, name)) is not None:
            gauge.add_metric(base, number)
    for name, hist in snapshot.histograms.items():
        if (histogram := family(HISTOGRAMS_GROUP, name)) is not None:
            buckets = [(le, float(n)) for le, n in hist.cumulative()]
            histogram.add_metric(base, buckets=buckets, sum_value=hist.sum)


def fleet_families(
    observer: FleetObserver,
    *,
    names: Mapping[UUID, str],
    seen_incidents: dict[Pair, float] | None = None,
    cache: dict[UUID, Parsed] | None = None,
    now: float | None = None,
) -> list[Metric]:
    """Return every metric family for the agents and incidents the observer holds."""
    families = {(group, key): new_family(group, key) for group, key in family_keys()}
    for row in agent_rows(observer, names, now):
        _, figures, snapshot = _parsed(row, cache)
        add_agent(families, row, figures, snapshot)
    return [*families.values(), *observer_families(observer, seen_incidents)]


def observer_families(observer: FleetObserver, seen: dict[Pair, float] | None) -> list[Metric]:
    """Return the families of the exporter's own reading, after the agents' (every scrape)."""
    return [warroom_family(observer, seen), replays_family(observer)]


def replays_family(observer: FleetObserver) -> Metric:
    """Return the war-room posts the observer did not take as replays, by reason."""
    family = CounterMetricFamily(
        "vox_warroom_replays",
        "war-room posts not taken as replays (docs/security.md): STALE, refused as older "
        "than the replay window; NOT_NEWER, ignored as not newer than the post held",
        labels=["reason"],
    )
    # Both reasons always, from 0: a rate over them needs the series before the first.
    for reason in REPLAY_REASONS:
        family.add_metric([reason], float(observer.replays.get(reason, 0)))
    return family


def warroom_family(observer: FleetObserver, seen: dict[Pair, float] | None) -> Metric:
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


def link_families(connected: Callable[[], bool] | None) -> list[Metric]:
    """Return vox_exporter_broker_connected, when the exporter says whether it is connected."""
    if connected is None:
        return []
    link = GaugeMetricFamily(
        "vox_exporter_broker_connected",
        "1 while the exporter's read-only session to the broker is up",
    )
    link.add_metric([], 1.0 if connected() else 0.0)
    return [link]


def on_loop(loop: asyncio.AbstractEventLoop | None, read: Callable[[], T], timeout: float) -> T:
    """Return read(), called on the observer's loop when it runs in another thread.

    The HTTP server scrapes from its own thread; the observer's dicts change on the loop's
    thread, so what a scrape reports is read there, between two messages.
    """
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or not loop.is_running() or running is loop:
        return read()

    async def call() -> T:
        return read()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout)


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
        return [*families, *link_families(self.connected)]

    def collect(self) -> Iterable[Metric]:
        """Build the families; on the observer's event loop when it runs in another thread."""
        with self._lock:
            return on_loop(self.loop, self._build, self.timeout)
