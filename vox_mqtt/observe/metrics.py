"""Agent metrics: cheap counters and fixed-bucket histograms, and their heartbeat snapshot.

The agent counts where the work happens (an increment per event, a bisect into a fixed
bucket tuple per timing) and its heartbeat carries `snapshot()` in `details.metrics`
under `"agent"`. Observers (a master, `vox status`, `vox exporter`) read it back with
`parse_snapshot`, which keeps only the metrics named in `SPEC` and bounds everything
else, so no agent's heartbeat can blow up an observer (docs/metrics.md).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final, TypeVar

from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
)

__all__ = [
    "COMMAND_BUCKETS",
    "COUNTERS",
    "GAUGES",
    "HISTOGRAMS",
    "HOST_METRICS",
    "MAX_COUNT",
    "MAX_LABEL_VALUES",
    "OTHER",
    "AgentMetrics",
    "CounterSpec",
    "Histogram",
    "HistogramSnapshot",
    "LabelledCounter",
    "MetricsSnapshot",
    "Range",
    "host_figure",
    "json_count",
    "json_number",
    "parse_host_metrics",
    "parse_snapshot",
    "quantile",
]

SNAPSHOT_VERSION: Final = 1
MAX_LABEL_VALUES: Final = 32  # distinct label values one counter keeps; the rest count as OTHER
MAX_LABEL_LENGTH: Final = 64
MAX_BUCKETS: Final = 40
OTHER: Final = "other"
# The message types every agent exchanges: their counters exist from the start.
CORE_TYPES: Final = (
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    MSG_COMMAND_ERROR,
    MSG_ACKNOWLEDGED,
)
MAX_COUNT: Final = 2**63 - 1
_T = TypeVar("_T")

# Upper bounds in seconds, shared by every timing: from a ledger group commit (sub-ms)
# to a command that waits on a slow specialist (a minute).
COMMAND_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True, kw_only=True)
class CounterSpec:
    """One counter the agent keeps: its label (None for a plain count) and meaning."""

    label: str | None
    help: str


# The contract between an agent's heartbeat and its observers. Exported as
# vox_agent_<name>_total, vox_agent_<name> and vox_agent_<name>_seconds.
COUNTERS: Final[Mapping[str, CounterSpec]] = {
    "messages_in": CounterSpec(label="type", help="VOX messages received, by type"),
    "messages_out": CounterSpec(label="type", help="VOX messages published, by type"),
    "rejected": CounterSpec(label="reason", help="inbound messages rejected, by reason code"),
    "duplicates": CounterSpec(label=None, help="duplicate deliveries re-acknowledged, not re-run"),
    "resends": CounterSpec(label=None, help="unacknowledged messages sent again"),
    "delivery_failures": CounterSpec(
        label=None, help="messages the broker refused or that were never acknowledged"
    ),
    "commands_served": CounterSpec(label="command", help="commands run by this agent's roles"),
    "commands_delegated": CounterSpec(label="command", help="commands delegated to a child"),
    "commands_failed": CounterSpec(label="code", help="commands answered with an error, by code"),
    "ledger_records": CounterSpec(label=None, help="records written to the ledger"),
    "reconnects": CounterSpec(label=None, help="broker connections after the first"),
    "unsigned": CounterSpec(label=None, help='unsigned messages let through (signatures "accept")'),
    "witness_skipped": CounterSpec(
        label=None, help="children's ledger heads not recorded: they came faster than the bound"
    ),
    # A request's life (docs/messages.md, lifecycle).
    "requests_ended": CounterSpec(
        label="state", help="requests served here that ended, by final state"
    ),
    "cancels_received": CounterSpec(label=None, help="cancel_requests accepted from the master"),
    "cancels_sent": CounterSpec(
        label=None, help="cancel_requests sent to a child (asked for, passed down, deadlines)"
    ),
    "progress_sent": CounterSpec(label=None, help="command_progress messages sent to the master"),
    "progress_dropped": CounterSpec(
        label=None, help="progress reports replaced by a newer one within the rate bound"
    ),
    "status_queries": CounterSpec(label=None, help="status_queries answered for the master"),
    # Beyond a peer's budget (agent/budget.py; docs/security.md, "Costs of a peer's messages").
    "unrecorded": CounterSpec(
        label="reason", help="refusals and unknown cancels beyond the peer's budget: not recorded"
    ),
}
GAUGES: Final[Mapping[str, str]] = {
    "inflight_commands": "commands being run or awaited by this agent",
    "intake_queue": "inbound messages received and not yet routed",
    "ledger_bytes": "size of the ledger database in bytes",
    "requests_received": "requests served here, received and waiting for a handler slot",
    "requests_working": "requests served here whose handler runs",
    "requests_delegated": "requests served here that wait for a child's answer",
}
HISTOGRAMS: Final[Mapping[str, str]] = {
    "command_handler_seconds": "time a role's command handler ran",
    "command_roundtrip_seconds": "time from sending a command to its answer, at the requester",
    "ledger_commit_seconds": "time one durable ledger commit took",
}
# The host figures a heartbeat has always carried (selfreport.host_metrics), with their meaning.
HOST_METRICS: Final[Mapping[str, str]] = {
    "cpu_percent": "host CPU use in percent over the last heartbeat interval",
    "memory_percent": "host memory in use, percent",
    "disk_percent": "use of the disk holding the agent's state, percent",
    "load_1m": "host load average over one minute",
    "process_rss_bytes": "resident memory of the agent process in bytes",
    "process_cpu_percent": "agent process CPU use in percent over the last interval",
    "uptime_s": "seconds since the host booted",
    "process_uptime_s": "seconds since the agent process started",
}

# The range each number of a heartbeat must lie in, by its kind (docs/metrics.md). A status
# whose metrics hold a number outside it is refused whole (`metricbounds.metrics_problem`):
# its agent is shown as rejected and nothing else of the fleet's view or /metrics is touched.
MAX_PERCENT: Final = 100.0
MAX_PROCESS_PERCENT: Final = 100.0 * 1024  # one process on up to 1024 cores
MAX_LOAD: Final = 1e6
MAX_BYTES: Final = float(2**63 - 1)
MAX_SECONDS: Final = 1e10  # about 317 years: an uptime, a timing, a bucket bound
MAX_SECONDS_SUM: Final = 1e15  # the sum of a histogram's timings
MAX_RATE: Final = 1e9  # messages per second
Range = tuple[float, float]
HOST_BOUNDS: Final[Mapping[str, Range]] = {
    "cpu_percent": (0.0, MAX_PERCENT),
    "memory_percent": (0.0, MAX_PERCENT),
    "disk_percent": (0.0, MAX_PERCENT),
    "load_1m": (0.0, MAX_LOAD),
    "process_rss_bytes": (0.0, MAX_BYTES),
    "process_cpu_percent": (0.0, MAX_PROCESS_PERCENT),
    "uptime_s": (0.0, MAX_SECONDS),
    "process_uptime_s": (0.0, MAX_SECONDS),
}
GAUGE_BOUNDS: Final[Mapping[str, Range]] = {
    "inflight_commands": (0.0, float(MAX_COUNT)),
    "intake_queue": (0.0, float(MAX_COUNT)),
    "ledger_bytes": (0.0, MAX_BYTES),
    "requests_received": (0.0, float(MAX_COUNT)),
    "requests_working": (0.0, float(MAX_COUNT)),
    "requests_delegated": (0.0, float(MAX_COUNT)),
}


class LabelledCounter:
    """Counts by one small label (message type, error code), capped at MAX_LABEL_VALUES."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc(self, key: str, amount: int = 1) -> None:
        """Add amount under key (under OTHER once the cap of distinct keys is reached)."""
        values = self.values
        if key in values:
            values[key] += amount
        elif len(values) < MAX_LABEL_VALUES - 1:
            values[key[:MAX_LABEL_LENGTH]] = values.get(key[:MAX_LABEL_LENGTH], 0) + amount
        else:
            values[OTHER] = values.get(OTHER, 0) + amount

    def total(self) -> int:
        """Return the sum over every label."""
        return sum(self.values.values())

    def seed(self, keys: Iterable[str]) -> None:
        """Start these keys at 0: a series that exists before its first event lets rate() see it."""
        for key in keys:
            if key not in self.values and len(self.values) < MAX_LABEL_VALUES - 1:
                self.values[key] = 0


class Histogram:
    """Observations counted into fixed buckets (upper bounds, plus one for +Inf)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = COMMAND_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation: bucket i holds bounds[i-1] < value <= bounds[i]."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def time_since(self, started: float) -> None:
        """Observe the seconds elapsed since a time.perf_counter() reading."""
        self.observe(time.perf_counter() - started)


class _Uncounted(LabelledCounter):
    """A counter that counts nothing: metrics turned off (the benchmark's baseline)."""

    __slots__ = ()

    def inc(self, key: str, amount: int = 1) -> None:
        """Do nothing."""


class _Unobserved(Histogram):
    """A histogram that keeps nothing: metrics turned off."""

    __slots__ = ()

    def observe(self, value: float) -> None:
        """Do nothing."""


class AgentMetrics:
    """Every counter, gauge and histogram of one agent, and its heartbeat snapshot."""

    def __init__(
        self, *, enabled: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = enabled
        counter = LabelledCounter if enabled else _Uncounted
        histogram = Histogram if enabled else _Unobserved
        self.counters: dict[str, LabelledCounter] = {name: counter() for name in COUNTERS}
        # Plain counts are attributes: `metrics.duplicates += 1` is the whole cost.
        self.duplicates = 0
        self.resends = 0
        self.delivery_failures = 0
        self.ledger_records = 0
        self.reconnects = 0
        self.unsigned = 0  # counted by the session's verdicts (docs/security.md, modes)
        self.witness_skipped = 0
        self.cancels_received = 0
        self.cancels_sent = 0
        self.progress_sent = 0
        self.progress_dropped = 0
        self.status_queries = 0
        c = self.counters
        self.requests_ended = c["requests_ended"]
        self.messages_in = c["messages_in"]
        self.messages_out = c["messages_out"]
        if enabled:
            self.messages_in.seed(CORE_TYPES)
            self.messages_out.seed(CORE_TYPES)
        self.rejected = c["rejected"]
        self.unrecorded = c["unrecorded"]
        self.commands_served = c["commands_served"]
        self.commands_delegated = c["commands_delegated"]
        self.commands_failed = c["commands_failed"]
        self.histograms: dict[str, Histogram] = {name: histogram() for name in HISTOGRAMS}
        h = self.histograms
        self.command_handler_seconds = h["command_handler_seconds"]
        self.command_roundtrip_seconds = h["command_roundtrip_seconds"]
        self.ledger_commit_seconds = h["ledger_commit_seconds"]
        self._gauges: dict[str, Callable[[], float]] = {}
        self._clock = clock
        self._last: tuple[float, int] = (clock(), 0)

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """Register how to read a gauge of GAUGES when a snapshot is taken."""
        if name not in GAUGES:
            raise ValueError(f"unknown gauge {name!r}")
        self._gauges[name] = read

    def snapshot(self) -> dict[str, Any] | None:
        """Return the compact, JSON-ready values for a heartbeat's details.metrics.agent."""
        if not self.enabled:
            return None
        counters: dict[str, Any] = {}
        for name, spec in COUNTERS.items():
            if spec.label is None:
                counters[name] = int(getattr(self, name))
            else:
                counters[name] = dict(self.counters[name].values)
        gauges: dict[str, float] = {}
        for name, read in self._gauges.items():
            try:
                gauges[name] = float(read())
            except Exception:  # a gauge that cannot be read is left out, never fatal
                continue
        histograms = {
            name: {"le": list(h.bounds), "counts": list(h.counts), "sum": round(h.sum, 6)}
            for name, h in self.histograms.items()
        }
        # Messages per second since the previous snapshot: for people (vox status);
        # Prometheus computes its own rate() from the counters.
        now = self._clock()
        moved = self.messages_in.total() + self.messages_out.total()
        last_at, last_moved = self._last
        self._last = (now, moved)
        elapsed = now - last_at
        rate = (moved - last_moved) / elapsed if elapsed > 0 else 0.0
        return {
            "v": SNAPSHOT_VERSION,
            "counters": counters,
            "gauges": gauges,
            "histograms": histograms,
            "messages_per_s": round(rate, 3),
        }


# --- the observer's side -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HistogramSnapshot:
    """One histogram as read from a heartbeat: bucket bounds, per-bucket counts, sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # len(bounds) + 1: the last is above every bound
    sum: float

    @property
    def count(self) -> int:
        """Return the number of observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Return Prometheus buckets: (le, observations <= le), ending with +Inf."""
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((_le(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass(frozen=True, kw_only=True)
class MetricsSnapshot:
    """An agent's metrics as an observer may trust them: known names, bounded sizes."""

    counters: dict[str, dict[str, int]] = field(default_factory=dict)  # "" for plain counts
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, HistogramSnapshot] = field(default_factory=dict)
    messages_per_s: float | None = None

    def errors(self) -> int:
        """Return rejected inbound messages, failed commands and failed deliveries."""
        return sum(
            sum(self.counters.get(name, {}).values())
            for name in ("rejected", "commands_failed", "delivery_failures")
        )


def _le(bound: float) -> str:
    return repr(float(bound))


def json_count(value: Any) -> int | None:
    """Return a JSON number as a count (a whole number, 0 to MAX_COUNT), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def json_number(value: Any, bounds: Range | None = None) -> float | None:
    """Return a JSON number as a finite float (within bounds, when given), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond every float (10**400 is valid JSON)
        return None
    if not math.isfinite(number):
        return None
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        return None
    return number


def _label(value: Any) -> str | None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_LABEL_LENGTH:
        return None
    return value if value.isprintable() else None


def _counter(raw: Any, labelled: bool) -> dict[str, int] | None:
    if not labelled:
        n = json_count(raw)
        return None if n is None else {"": n}
    if not isinstance(raw, dict):
        return None
    values: dict[str, int] = {}
    for key, value in raw.items():
        label, n = _label(key), json_count(value)
        if label is None or n is None:
            continue
        if len(values) >= MAX_LABEL_VALUES:
            break
        values[label] = n
    return values


def _histogram(raw: Any) -> HistogramSnapshot | None:
    if not isinstance(raw, dict):
        return None
    bounds_raw, counts_raw = raw.get("le"), raw.get("counts")
    if not isinstance(bounds_raw, list) or not isinstance(counts_raw, list):
        return None
    if not 0 < len(bounds_raw) <= MAX_BUCKETS or len(counts_raw) != len(bounds_raw) + 1:
        return None
    bounds = [json_number(b, (0.0, MAX_SECONDS)) for b in bounds_raw]
    counts = [json_count(c) for c in counts_raw]
    total = json_number(raw.get("sum"), (0.0, MAX_SECONDS_SUM))
    if total is None or any(b is None for b in bounds) or any(c is None for c in counts):
        return None
    checked = tuple(b for b in bounds if b is not None)
    if any(a >= b for a, b in pairwise(checked)):
        return None  # bounds must rise strictly, or the buckets mean nothing
    return HistogramSnapshot(
        bounds=checked, counts=tuple(c for c in counts if c is not None), sum=total
    )


def _known(
    section: Any, names: Iterable[str], parse: Callable[[str, Any], _T | None]
) -> dict[str, _T]:
    """Return the known names of a section whose values parse; a non-dict section has none."""
    if not isinstance(section, dict):
        return {}
    found: dict[str, _T] = {}
    for name in names:
        value = parse(name, section.get(name))
        if value is not None:
            found[name] = value
    return found


def parse_snapshot(raw: Any) -> MetricsSnapshot | None:
    """Return the trusted part of a heartbeat's metrics.agent dict, or None if it has none."""
    if not isinstance(raw, dict) or raw.get("v") != SNAPSHOT_VERSION:
        return None
    counters = _known(
        raw.get("counters"), COUNTERS, lambda name, v: _counter(v, COUNTERS[name].label is not None)
    )
    gauges = _known(raw.get("gauges"), GAUGES, lambda name, v: json_number(v, GAUGE_BOUNDS[name]))
    histograms = _known(raw.get("histograms"), HISTOGRAMS, lambda _, v: _histogram(v))
    rate = json_number(raw.get("messages_per_s"), (0.0, MAX_RATE))
    return MetricsSnapshot(
        counters=counters,
        gauges=gauges,
        histograms=histograms,
        messages_per_s=None if rate is None or rate < 0 else rate,
    )


def host_figure(name: str, value: Any) -> float | None:
    """Return one host figure of HOST_METRICS as a float if it is a number within bounds."""
    return json_number(value, HOST_BOUNDS[name])


def parse_host_metrics(raw: Any) -> dict[str, float]:
    """Return the known host figures of a heartbeat's details.metrics that are numbers."""
    if not isinstance(raw, dict):
        return {}
    figures = {}
    for name in HOST_METRICS:
        number = json_number(raw.get(name), HOST_BOUNDS[name])
        if number is not None:
            figures[name] = number
    return figures


def quantile(histogram: HistogramSnapshot, q: float) -> float | None:
    """Estimate a quantile from the buckets (linear within a bucket, as Prometheus does)."""
    total = histogram.count
    if total == 0:
        return None
    rank = q * total
    running = 0
    lower = 0.0
    for bound, n in zip(histogram.bounds, histogram.counts, strict=False):
        if n and running + n >= rank:
            return lower + (bound - lower) * (rank - running) / n
        running += n
        lower = bound
    return histogram.bounds[-1]  # in the +Inf bucket: the highest bound is all one can say
