"""Agent metrics: counting, the heartbeat snapshot and the observer's bounded parser."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vox_mqtt.observe.metrics import (
    COMMAND_BUCKETS,
    CORE_TYPES,
    COUNTERS,
    MAX_LABEL_VALUES,
    OTHER,
    AgentMetrics,
    Histogram,
    HistogramSnapshot,
    LabelledCounter,
    parse_host_metrics,
    parse_snapshot,
    quantile,
)


def test_labelled_counter_counts_by_key_and_caps_distinct_keys() -> None:
    counter = LabelledCounter()
    for i in range(100):
        counter.inc(f"type-{i}")
    counter.inc("type-0", 5)
    assert len(counter.values) == MAX_LABEL_VALUES
    assert counter.values["type-0"] == 6
    assert counter.values[OTHER] == 100 - (MAX_LABEL_VALUES - 1)
    assert counter.total() == 105


def test_histogram_buckets_are_upper_bounds_inclusive() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]
    assert abs(histogram.sum - 4.65) < 1e-9


def test_snapshot_is_compact_json_and_parses_back() -> None:
    clock = [100.0]
    metrics = AgentMetrics(clock=lambda: clock[0])
    metrics.messages_in.inc("command_request", 3)
    metrics.messages_out.inc("message_acknowledged", 3)
    metrics.rejected.inc("UNAUTHORIZED_SOURCE")
    metrics.commands_failed.inc("HANDLER_ERROR", 2)
    metrics.duplicates += 4
    metrics.reconnects += 1
    metrics.command_handler_seconds.observe(0.003)
    metrics.gauge("intake_queue", lambda: 7)
    metrics.gauge("ledger_bytes", lambda: 1 / 0)  # unreadable: left out, not fatal
    clock[0] = 102.0
    raw = json.loads(json.dumps(metrics.snapshot()))
    assert raw["messages_per_s"] == 3.0
    assert len(json.dumps(raw)) < 2000

    snap = parse_snapshot(raw)
    assert snap is not None
    # The core message types exist from the start, at 0, so rate() sees their first event.
    assert snap.counters["messages_in"] == dict.fromkeys(CORE_TYPES, 0) | {"command_request": 3}
    assert snap.counters["duplicates"] == {"": 4}
    assert snap.counters["reconnects"] == {"": 1}
    assert snap.gauges == {"intake_queue": 7.0}
    handler = snap.histograms["command_handler_seconds"]
    assert handler.count == 1
    assert handler.bounds == COMMAND_BUCKETS
    assert snap.errors() == 3
    assert set(snap.counters) == set(COUNTERS)


def test_cumulative_buckets_and_quantile() -> None:
    histogram = HistogramSnapshot(bounds=(0.1, 1.0), counts=(2, 2, 1), sum=4.0)
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert quantile(histogram, 0.5) == 0.1 + 0.9 * (2.5 - 2) / 2
    assert quantile(HistogramSnapshot(bounds=(1.0,), counts=(0, 0), sum=0.0), 0.5) is None


def test_parser_keeps_only_known_bounded_values() -> None:
    hostile: dict[str, Any] = {
        "v": 1,
        "counters": {
            "messages_in": {f"t{i}": i for i in range(10_000)} | {"x" * 500: 1, "bad": -1},
            "duplicates": "many",
            "resends": True,
            "invented_counter": {"a": 1},
        },
        "gauges": {"intake_queue": float("nan"), "made_up": 1, "ledger_bytes": 10},
        "histograms": {
            "command_handler_seconds": {"le": [1, 0.5], "counts": [1, 1, 1], "sum": 1},
            "ledger_commit_seconds": {"le": list(range(1000)), "counts": [0] * 1001, "sum": 0},
            "command_roundtrip_seconds": {"le": [1], "counts": [1, 2], "sum": 2.5},
        },
        "messages_per_s": -4,
    }
    snap = parse_snapshot(hostile)
    assert snap is not None
    assert len(snap.counters["messages_in"]) == MAX_LABEL_VALUES
    assert all(len(k) <= 64 for k in snap.counters["messages_in"])
    assert "duplicates" not in snap.counters
    assert "resends" not in snap.counters
    assert "invented_counter" not in snap.counters
    assert snap.gauges == {"ledger_bytes": 10.0}
    assert list(snap.histograms) == ["command_roundtrip_seconds"]
    assert snap.messages_per_s is None
    assert parse_snapshot({"v": 99}) is None
    assert parse_snapshot("nope") is None


def test_host_metrics_parser_keeps_known_numbers() -> None:
    raw = {"cpu_percent": 12.5, "memory_percent": "lots", "load_1m": True, "evil": 1}
    assert parse_host_metrics(raw) == {"cpu_percent": 12.5}
    assert parse_host_metrics(None) == {}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(
    counters=st.dictionaries(st.sampled_from([*COUNTERS, "zz"]), _json, max_size=6),
    histograms=st.dictionaries(st.sampled_from(["command_handler_seconds", "q"]), _json),
)
def test_parser_never_raises(counters: dict[str, Any], histograms: dict[str, Any]) -> None:
    snap = parse_snapshot({"v": 1, "counters": counters, "histograms": histograms, "gauges": []})
    assert snap is not None
    for values in snap.counters.values():
        assert len(values) <= MAX_LABEL_VALUES
        assert all(isinstance(n, int) and n >= 0 for n in values.values())


def test_turned_off_metrics_count_nothing_and_have_no_snapshot() -> None:
    metrics = AgentMetrics(enabled=False)
    metrics.messages_in.inc("command_request")
    metrics.command_handler_seconds.observe(0.1)
    assert metrics.messages_in.values == {}
    assert metrics.command_handler_seconds.counts == [0] * (len(COMMAND_BUCKETS) + 1)
    assert metrics.snapshot() is None
