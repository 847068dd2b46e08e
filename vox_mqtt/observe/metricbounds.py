"""Numbers within bounds: why the metrics of a status are not to be believed (docs/metrics.md).

Every number an observer reads from a heartbeat must be finite and within its kind's range
(`HOST_BOUNDS`, `GAUGE_BOUNDS` and the `MAX_*` constants of metrics.py). Observers take
every agent's status at every heartbeat, so each list of numbers is checked at C speed
first (types, finite, min and max) and walked one value at a time only to say why not.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, Final

from vox_mqtt.observe.metrics import (
    COUNTERS,
    GAUGE_BOUNDS,
    HISTOGRAMS,
    HOST_BOUNDS,
    MAX_COUNT,
    MAX_RATE,
    MAX_SECONDS,
    MAX_SECONDS_SUM,
    Range,
    json_count,
    json_number,
)

__all__ = ["metrics_problem"]


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _out_of(where: str, value: Any, bounds: Range) -> str | None:
    """Say why a number is not to be believed, or None when it is one within bounds."""
    if json_number(value, bounds) is not None:
        return None
    return _outside(where, value, bounds)


def _outside(where: str, value: Any, bounds: Range) -> str:
    shown = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
    return f"{where} = {shown[:40]} is outside [{bounds[0]:g}, {bounds[1]:g}]"


def _count_problem(where: str, value: Any) -> str | None:
    """Say why a number that should be a count is not one (a whole number, 0 to 2**63-1)."""
    if not _is_number(value) or json_count(value) is not None:
        return None
    if isinstance(value, int):
        # Compared as an int: 2**63 is no count, though as a float it equals the bound.
        return _outside(where, value, (0, MAX_COUNT))
    return f"{where} = {repr(value)[:40]} is not a whole count"


_NUMBER_TYPES: Final = frozenset({int, float})
_INT_TYPES: Final = frozenset({int})


def _all_within(values: Collection[Any], bounds: Range, *, whole: bool) -> bool:
    """Tell at C speed that every value is a number of its kind within bounds.

    True only when none of them can be a problem (plain ints, or finite plain floats too
    unless whole); False sends the caller through its per-value check, which says why.
    """
    kinds = set(map(type, values))
    if not kinds <= (_INT_TYPES if whole else _NUMBER_TYPES):
        return False
    if not kinds:
        return True
    if float in kinds and not all(map(math.isfinite, values)):
        return False
    return bool(bounds[0] <= min(values) and max(values) <= bounds[1])


# Counts compare as ints: float(2**63 - 1) rounds up to 2**63, one past the largest count.
_COUNT_RANGE: Final[Range] = (0, MAX_COUNT)
_BOUND_RANGE: Final[Range] = (0.0, MAX_SECONDS)


def _histogram_problem(where: str, raw: dict[Any, Any]) -> str | None:
    bounds = raw.get("le")
    if isinstance(bounds, list) and not _all_within(bounds, _BOUND_RANGE, whole=False):
        for bound in bounds:
            if _is_number(bound) and (problem := _out_of(f"{where}.le", bound, _BOUND_RANGE)):
                return problem
    counts = raw.get("counts")
    if isinstance(counts, list) and not _all_within(counts, _COUNT_RANGE, whole=True):
        for n in counts:
            if problem := _count_problem(f"{where}.counts", n):
                return problem
    total = raw.get("sum")
    if _is_number(total):
        return _out_of(f"{where}.sum", total, (0.0, MAX_SECONDS_SUM))
    return None


def _section(raw: dict[Any, Any], key: str) -> dict[Any, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _snapshot_problem(raw: dict[Any, Any]) -> str | None:
    where = "metrics.agent"
    counters = _section(raw, "counters")
    # Every count of every known counter at once; only a doubt walks them one by one.
    every: list[Any] = []
    for name in COUNTERS:
        value = counters.get(name)
        if isinstance(value, dict):
            every.extend(value.values())
        elif value is not None:
            every.append(value)
    if not _all_within(every, _COUNT_RANGE, whole=True):
        for name in COUNTERS:
            value = counters.get(name)
            for n in value.values() if isinstance(value, dict) else [value]:
                if problem := _count_problem(f"{where}.counters.{name}", n):
                    return problem
    gauges = _section(raw, "gauges")
    for name, bounds in GAUGE_BOUNDS.items():
        value = gauges.get(name)
        if _is_number(value) and (problem := _out_of(f"{where}.gauges.{name}", value, bounds)):
            return problem
    histograms = _section(raw, "histograms")
    for name in HISTOGRAMS:
        value = histograms.get(name)
        if isinstance(value, dict) and (
            problem := _histogram_problem(f"{where}.histograms.{name}", value)
        ):
            return problem
    rate = raw.get("messages_per_s")
    if _is_number(rate):
        return _out_of(f"{where}.messages_per_s", rate, (0.0, MAX_RATE))
    return None


def metrics_problem(metrics: Any) -> str | None:
    """Return why a status's details.metrics holds a number out of its kind's range, or None.

    Every number an observer reads from a heartbeat (the host figures, and the counters,
    gauges, histograms and rate of the agent's snapshot) must be finite and within the
    range HOST_BOUNDS, GAUGE_BOUNDS and the MAX_* constants give its kind. What is not a
    number, or not a known name, is left out by the parsers and is no problem here.
    """
    if not isinstance(metrics, dict):
        return None
    for name, bounds in HOST_BOUNDS.items():
        value = metrics.get(name)
        if _is_number(value) and (problem := _out_of(f"metrics.{name}", value, bounds)):
            return problem
    agent = metrics.get("agent")
    if isinstance(agent, dict):
        return _snapshot_problem(agent)
    return None
