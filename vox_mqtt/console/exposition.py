"""The fleet's /metrics text, kept between scrapes: what did not change is not rendered again.

A scrape of 10,000 agents is about a million series. Rebuilding every family and having
prometheus_client format every sample at each scrape takes seconds, yet between two
heartbeats most of an agent's text is the same: its labels, its liveness, its counters and
histograms while it is idle. So each agent's text is kept per group of families
(exporter.GROUPS), rendered by prometheus_client's own `generate_latest` when that group's
inputs change and reused while they do not; the families that change at every heartbeat or
scrape (the host figures, the heartbeat age) keep the agent's rendered label set and only
format the new value (prometheus_client's `floatToGoString`). The output is byte for byte
what `generate_latest` gives for `exporter.fleet_families` (a unit test checks it).
docs/metrics.md explains the cost and what it holds in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast
from uuid import UUID

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from vox_mqtt.console.exporter import (
    AGE,
    COUNTERS_GROUP,
    GAUGES_GROUP,
    HISTOGRAMS_GROUP,
    HOST,
    HOST_FAMILIES,
    LIVENESS,
    AgentRow,
    Pair,
    add_agent,
    agent_rows,
    family_keys,
    link_families,
    new_family,
    observer_families,
    on_loop,
)
from vox_mqtt.observe.metrics import (
    COUNTERS,
    SNAPSHOT_VERSION,
    MetricsSnapshot,
    host_figure,
    parse_snapshot,
)
from vox_mqtt.observe.observer import FleetObserver

__all__ = ["GZIP_LEVEL", "CachedExposition", "FamilyList", "metrics_app", "render_families"]

Key = tuple[str, str]
_KEYS: Final = family_keys()
_AGE: Final = (AGE, "age")
_CACHED_GROUPS: Final = (LIVENESS, COUNTERS_GROUP, GAUGES_GROUP, HISTOGRAMS_GROUP)
# Each family's text starts at a HELP line; sample lines start with a metric name, and
# label values are escaped (no newline), so a line-start "# HELP " is always a header.
_HEADER: Final = re.compile(rb"^# HELP ", re.MULTILINE)
# prometheus_client compresses at gzip.compress's default, level 9; level 1 is the cheapest and
# still shrinks the 131 MB of 10,000 agents 10 x (figure 11 times it: docs/performance.md).
GZIP_LEVEL: Final = 1
_NEVER: Final = object()  # the inputs of a group not rendered yet: equal to nothing


class FamilyList(Collector):
    """A collector that yields the families it was given: prometheus_client renders them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        """Return the families."""
        return self.families


def render_families(families: Sequence[Metric]) -> list[tuple[bytes, bytes]]:
    """Return (header, samples) per family, as prometheus_client's text format renders them."""
    text = generate_latest(FamilyList(families))
    starts = [m.start() for m in _HEADER.finditer(text)]
    out = []
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        part = text[begin:end]
        cut = part.index(b"\n", part.index(b"\n") + 1) + 1  # after the HELP and TYPE lines
        out.append((part[:cut], part[cut:]))
    if len(out) != len(families):
        raise ValueError(f"rendered {len(out)} families for {len(families)} given")
    return out


_go_string = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus_client
_FORMATTED: dict[float, bytes] = {}
_MAX_FORMATTED: Final = 65_536


def _value(value: float) -> bytes:
    """Return a sample's value as prometheus_client formats it; counts repeat, so keep them."""
    text = _FORMATTED.get(value)
    if text is None:
        text = _go_string(value).encode()
        if value != 0:  # 0.0 and -0.0 are one key but two texts
            if len(_FORMATTED) >= _MAX_FORMATTED:
                _FORMATTED.clear()
            _FORMATTED[value] = text
    return text


def _sample_key(sample: Sample) -> tuple[str, tuple[str, ...]]:
    """Return what names one sample line of an agent: its name and label values."""
    return (sample.name, tuple(sample.labels.values()))


def _inputs(group: str, row: AgentRow) -> Any:
    """Return what a cached group's text depends on, besides the agent's labels."""
    if group == LIVENESS:
        return (row.status, row.interval, row.epoch)
    raw = row.metrics.get("agent")
    if not isinstance(raw, dict) or raw.get("v") != SNAPSHOT_VERSION:
        return None  # no snapshot: the group is empty
    section = {COUNTERS_GROUP: "counters", GAUGES_GROUP: "gauges"}.get(group, "histograms")
    return (True, raw.get(section))


@dataclass(slots=True)
class _AgentText:
    """One agent's rendered text: per cached group its inputs and per family its samples."""

    labels: tuple[str, str, str]
    inputs: dict[str, Any] = field(default_factory=dict)
    samples: dict[Key, bytes] = field(default_factory=dict)
    prefixes: dict[Any, bytes] = field(default_factory=dict)  # a sample line up to its value
    before: tuple[bytes, ...] = ()  # the cached families' samples before the age family
    after: tuple[bytes, ...] = ()  # and after it, up to the host families
    metrics_of: Any = None  # the status metrics dict the cached groups were checked against
    host_of: Any = None  # the status metrics dict the host lines were formatted from
    host: tuple[bytes, ...] = ()
    host_values: dict[str, tuple[Any, bytes]] = field(default_factory=dict)  # raw, line


# Each family's name as prometheus_client makes it (a counter's without its "_total").
_NAMES: Final = {key: new_family(*key).name for key in _KEYS}


def _snapshot_lines(text: _AgentText, key: Key, snapshot: MetricsSnapshot) -> bytes | None:
    """Return a snapshot family's samples as add_agent and generate_latest give them.

    The samples are the ones prometheus_client's CounterMetricFamily, GaugeMetricFamily
    and HistogramMetricFamily.add_metric make for add_agent's arguments, each written as
    its kept prefix and value; None if a line was never rendered (or for other groups):
    the caller then builds the family.
    """
    group, name = key
    base = text.labels
    family = _NAMES[key]
    samples: list[tuple[str, tuple[str, ...], float]] = []
    if group == COUNTERS_GROUP:
        values = snapshot.counters.get(name)
        if values is not None:
            if COUNTERS[name].label is None:
                samples.append((family + "_total", base, float(values.get("", 0))))
            else:
                total = family + "_total"
                samples += [(total, (*base, lb), float(v)) for lb, v in values.items()]
    elif group == GAUGES_GROUP:
        number = snapshot.gauges.get(name)
        if number is not None:
            samples.append((family, base, number))
    elif group == HISTOGRAMS_GROUP:
        hist = snapshot.histograms.get(name)
        if hist is not None:
            buckets = [(le, float(n)) for le, n in hist.cumulative()]
            bucket = family + "_bucket"
            samples += [(bucket, (*base, le), n) for le, n in buckets]
            # HistogramMetricFamily.add_metric: no count and sum after a negative bucket.
            if float(buckets[0][0]) >= 0 and hist.sum is not None:
                samples.append((family + "_count", base, buckets[-1][1]))
                samples.append((family + "_sum", base, hist.sum))
    else:
        return None
    prefixes = text.prefixes
    out = []
    for sample_name, labels, value in samples:
        prefix = prefixes.get((sample_name, labels))
        if prefix is None:
            return None
        out.append(prefix + _value(value) + b"\n")
    return b"".join(out)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while a scrape builds its text.

    A scrape of 10,000 agents allocates about a million tuples and lines, which sets off
    collections that walk the exporter's whole heap (every kept status): 0.05 - 0.2 s of
    a 0.7 - 0.95 s steady scrape (docs/performance.md, figure 11). What a scrape makes
    holds no reference cycle, so nothing waits on the collector; it runs again after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CachedExposition:
    """Build the fleet's /metrics body, rendering again only what changed since the last one."""

    def __init__(
        self,
        observer: FleetObserver,
        *,
        names: Mapping[UUID, str] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        connected: Callable[[], bool] | None = None,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.observer = observer
        self.clock = clock
        self.names = dict(names or {})
        self.loop = loop
        self.connected = connected
        self.timeout = timeout
        self._seen: dict[Pair, float] = {}
        self._agents: dict[UUID, _AgentText] = {}
        self._headers = {
            key: header
            for key, (header, _) in zip(
                _KEYS, render_families([new_family(*key) for key in _KEYS]), strict=True
            )
        }
        self._lock = threading.Lock()
        self.rendered_families = 0  # per-agent families prometheus_client rendered (the bench)
        self.built_families = 0  # per-agent families built as prometheus_client objects

    def _read(self) -> tuple[list[AgentRow], list[Metric]]:
        """Take what this scrape reports, on the observer's loop (cheap: no text is built)."""
        rows = agent_rows(self.observer, self.names, self.clock())
        tail = observer_families(self.observer, self._seen)
        return rows, [*tail, *link_families(self.connected)]

    def _snapshot(self) -> tuple[list[AgentRow], list[Metric]]:
        # The rows are read on the observer's loop; the text is built here, off the loop:
        # rows only hold values and each status's own dict.
        return on_loop(self.loop, self._read, self.timeout)

    def body(self) -> bytes:
        """Return the text of one scrape (prometheus_client's text format 0.0.4)."""
        with self._lock, _collector_paused():
            rows, tail = self._snapshot()
            columns: list[tuple[bytes, ...]] = []
            present = set()
            for row in rows:
                present.add(row.id)
                text = self._agent(row)
                age = b"" if row.age is None else self._line(text, row, _AGE, round(row.age, 3))
                columns.append((*text.before, age, *text.after, *self._host(text, row)))
            for gone in self._agents.keys() - present:
                del self._agents[gone]
            # Each agent's row of samples, one per family, turned into each family's column.
            families = zip(*columns, strict=True) if columns else ([] for _ in _KEYS)
            out = []
            for key, samples in zip(_KEYS, families, strict=True):
                out.append(self._headers[key])
                out.extend(samples)
            out += [h + s for h, s in render_families(tail)]
            return b"".join(out)

    def _host(self, text: _AgentText, row: AgentRow) -> tuple[bytes, ...]:
        """Return the host families' lines of an agent, formatted once per status received."""
        metrics = row.metrics
        if text.host_of is metrics:
            return text.host
        lines = []
        kept = text.host_values
        for name in HOST_FAMILIES:
            raw = metrics.get(name)
            last = kept.get(name)
            # A figure that did not move since the last status keeps its line (a disk).
            if last is None or last[0] != raw or type(last[0]) is not type(raw):
                value = host_figure(name, raw)
                line = b"" if value is None else self._line(text, row, (HOST, name), value)
                last = kept[name] = (raw, line)
            lines.append(last[1])
        text.host_of, text.host = metrics, tuple(lines)
        return text.host

    def _agent(self, row: AgentRow) -> _AgentText:
        """Return the agent's text, its cached groups rendered again where inputs changed."""
        text = self._agents.get(row.id)
        if text is None or text.labels != row.labels:
            text = self._agents[row.id] = _AgentText(labels=row.labels)
        elif text.metrics_of is row.metrics and text.inputs.get(LIVENESS) == _inputs(LIVENESS, row):
            return text  # no status since the last scrape, no change of state
        stale = [g for g in _CACHED_GROUPS if text.inputs.get(g, _NEVER) != _inputs(g, row)]
        text.metrics_of = row.metrics
        if not stale:
            return text
        snapshot: MetricsSnapshot | None = None
        if stale != [LIVENESS]:
            snapshot = parse_snapshot(row.metrics.get("agent"))
        families: dict[Key, Metric] = {}
        for key in _KEYS:
            if key[0] not in stale:
                continue
            # A snapshot's family whose every line is known is written from the kept
            # prefixes straight from the snapshot; prometheus_client objects are built
            # only for the others (a tenth of the agents work between two scrapes: their
            # families were half of a steady scrape, docs/performance.md figure 11).
            fast = None if snapshot is None else _snapshot_lines(text, key, snapshot)
            if fast is None:
                families[key] = new_family(*key)
            else:
                text.samples[key] = fast
        add_agent(families, row, {}, snapshot)
        self.built_families += len(families)
        unknown = []
        for key, family in families.items():
            known = self._known_lines(text, family)
            if known is None:
                unknown.append(key)
            else:
                text.samples[key] = known
        if unknown:
            # A sample never seen (a new agent, a new label value): prometheus_client
            # renders the family, and each line's text before its value is kept.
            rendered = render_families([families[key] for key in unknown])
            for key, (_, samples) in zip(unknown, rendered, strict=True):
                text.samples[key] = samples
                lines = samples[:-1].split(b"\n") if samples else []
                for sample, line in zip(families[key].samples, lines, strict=True):
                    text.prefixes[_sample_key(sample)] = line[: line.rindex(b" ") + 1]
            self.rendered_families += len(unknown)
        for group in stale:
            text.inputs[group] = _inputs(group, row)
        text.before = tuple(text.samples[key] for key in _KEYS[: _KEYS.index(_AGE)])
        text.after = tuple(
            text.samples[key] for key in _KEYS[_KEYS.index(_AGE) + 1 :] if key[0] != HOST
        )
        return text

    @staticmethod
    def _known_lines(text: _AgentText, family: Metric) -> bytes | None:
        """Return a family's samples from the kept line prefixes, or None if one is new."""
        prefixes = text.prefixes
        out = []
        for sample in family.samples:
            prefix = prefixes.get(_sample_key(sample))
            if prefix is None:
                return None
            out.append(prefix + _value(sample.value) + b"\n")
        return b"".join(out)

    def _line(self, text: _AgentText, row: AgentRow, key: Key, value: float) -> bytes:
        """Return one sample line of a family whose value changes at every heartbeat."""
        prefix = text.prefixes.get(key)
        if prefix is None:
            family = new_family(*key)
            assert isinstance(family, GaugeMetricFamily)  # the age and host families
            family.add_metric(list(row.labels), 0.0)
            ((_, line),) = render_families([family])
            # The value is the last field of the line: "name{labels} 0.0\n".
            prefix = text.prefixes[key] = line[: line.rindex(b" ") + 1]
        return prefix + _value(value) + b"\n"


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(body: Callable[[], bytes]) -> WsgiApp:
    """Return a WSGI app serving body() as prometheus_client's text format, gzipped if asked."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b"use GET\n"]
        output = body()
        headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(output))))
        start_response("200 OK", headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else output]

    return app
