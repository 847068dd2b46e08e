"""What the bench's smoke tests share: each figure at its tiny size, and its rows checked.

tests/integration/test_bench_smoke.py runs every figure but one; figure 16 (scale), the
suite's longest test, runs in tests/integration/test_bench_smoke_scale.py, a module of its
own so that the suite's workers take it beside the others (pytest -n, --dist loadfile).
No assertion here is about speed: benchmarks measure, tests only keep them from rotting.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import psutil

from bench.__main__ import FIGURES
from bench.one_hop import LAYOUTS

ROW_KEYS = {"title", "unit", "vox", "baseline", "ratio", "target", "met"}
ROWS = {
    "one_hop": 2,
    "three_levels": 2,
    "throughput": 2,
    "detection": 4,
    "footprint": 4,
    "bridged": 2,
    "fleet_large": 4,
    "metrics_cost": 3,
    "faststream": 2,
    "web_console": 2,
    "signatures": 3,
    "scale": 10,
    "request_life": 2,
    "burst_read": 2,
    "verbs": 5,
    "loaded": 2,
    "floor_parts": 2,
}


def check_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        assert row.keys() >= ROW_KEYS, row
        for key in ("vox", "baseline"):
            assert isinstance(row[key], int | float), row
            assert math.isfinite(row[key]), row
            assert row[key] >= 0, row
        assert row["ratio"] is None or row["ratio"] >= 0, row
        assert row["met"] in (True, False, None), row


def run_figure(name: str, tmp_path: Path) -> None:
    """Run one figure at its tiny size and check its rows."""
    number, run = FIGURES[name]
    outcome = run(tmp_path / name, True)
    rows = outcome if isinstance(outcome, list) else [outcome]
    assert len(rows) == ROWS.get(name, 1)
    check_rows(rows)
    assert number == list(FIGURES).index(name) + 1
    if name in ("one_hop", "three_levels", "throughput"):
        # Both layouts, against one and the same raw baseline.
        assert [row["layout"] for row in rows] == list(LAYOUTS)
        assert rows[1]["title"].split(":")[0].endswith("(process per agent)"), rows[1]
        assert len({json.dumps(row["baseline_detail"]) for row in rows}) == 1
    if name == "loaded":
        # Judged against the floor of the same loaded run, the raw ratio beside it; the
        # spinner was a process of its own and is gone.
        for row in rows:
            assert row["baseline_detail"]["p50_ms"] == row["baseline"], row
            assert row["vox_over_raw"] > 0, row
            assert not psutil.pid_exists(row["spinner_pid"]), row
    if name == "verbs":
        # Each verb three ways in one run; --help has no retained messages to compare with.
        titles = [row["title"] for row in rows]
        for verb in ("status", "warroom", "inbox", "request show", "--help"):
            assert any(title.startswith(f"`vox {verb}`") for title in titles), titles
        for row in rows:
            assert row["one_shot_median_s"] == row["baseline"], row
            assert row["console_p90_s"] >= row["vox"], row
            if "--help" not in row["title"]:
                assert row["mosquitto_sub_median_s"] > 0, row
                assert row["ratio_to_mosquitto_sub"] > 0, row
    if name == "scale":
        # `vox status` on the core of the tiny federation lists every agent, all ACTIVE.
        listed = next(row for row in rows if "`vox status --json`" in row["title"])
        assert listed["met"], listed
        assert listed["states"] == {"ACTIVE": listed["baseline"]}, listed
        # vox watch draws every agent in its last tree.
        drawn = next(row for row in rows if "`vox watch" in row["title"])
        assert drawn["met"], drawn
        # The storm rules hold on it: nothing ran twice, one incident per restarted site.
        storms = rows[-4:]
        assert all(row["met"] for row in storms), storms
