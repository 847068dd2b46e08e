"""Each benchmark runs once at tiny size and yields numbers with the expected keys.

No assertion here is about speed: benchmarks measure, tests only keep them from rotting.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import FIGURES, main
from bench.common import SEED_SHAPE, bench_broker, fleet_text
from bench.one_hop import raw_round_trips

ROW_KEYS = {"title", "unit", "vox", "baseline", "ratio", "target", "met"}
ROWS = {
    "detection": 4,
    "footprint": 4,
    "bridged": 2,
    "fleet_large": 4,
    "metrics_cost": 3,
    "faststream": 2,
    "web_console": 2,
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


@pytest.mark.parametrize("name", list(FIGURES))
def test_each_figure_runs_at_tiny_size(name: str, tmp_path: Path) -> None:
    number, run = FIGURES[name]
    outcome = run(tmp_path / name, True)
    rows = outcome if isinstance(outcome, list) else [outcome]
    assert len(rows) == ROWS.get(name, 1)
    check_rows(rows)
    assert number == list(FIGURES).index(name) + 1


def test_profile_of_the_throughput_figure_names_where_time_goes(tmp_path: Path) -> None:
    row = FIGURES["throughput"][1](tmp_path, True)
    assert isinstance(row, dict)
    profile = row["profile"]
    assert profile["busy_seconds"] > 0
    areas = {a["area"] for a in profile["areas"]}
    assert any(area.startswith("vox_mqtt.") for area in areas), areas
    assert profile["top_own_time"], profile
    # The inbound pipeline handles every message of the figure.
    assert any("vox_mqtt/agent/inbound.py" in f["function"] for f in profile["top_cumulative_vox"])


def test_the_runner_writes_markdown_and_json(tmp_path: Path) -> None:
    assert main(["--quick", "--only", "ledger,render", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["figures"]) == {"ledger", "render"}
    assert results["machine"]["nproc"] >= 1
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "make bench BENCH_ARGS='--quick --only ledger,render" in text
    assert "| 4 | Ledger" in text
    assert "| 7 | Render" in text


def test_the_report_is_rewritten_from_a_run_s_results(tmp_path: Path) -> None:
    assert main(["--quick", "--only", "render", "--out", str(tmp_path)]) == 0
    (tmp_path / "BENCHMARKS.md").unlink()
    assert main(["--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| 7 | Render" in text
    assert "a fixed Python loop of a million steps took" in text


def test_an_unknown_figure_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--only", "nope"])
    assert stop.value.code == 2
    assert "one_hop, three_levels" in capsys.readouterr().err


def test_the_obligations_floor_records_and_acknowledges_every_message(tmp_path: Path) -> None:
    # The floor in figures 1 and 2 claims the guarantees' own cost: it must really pay it.
    chain = ["operator", "root", "coordinator", "spec_a"]
    with bench_broker(tmp_path, fleet_text(SEED_SHAPE)) as bench:
        times = asyncio.run(raw_round_trips(bench, chain, 4, 1, durable=True))
    assert len(times) == 4

    def actions(name: str) -> dict[str, int]:
        with sqlite3.connect(tmp_path / f"journal-4-{name}.db") as db:
            found = db.execute("SELECT action, COUNT(*) FROM log GROUP BY action").fetchall()
        return dict(found)

    assert actions("operator") == {"sent": 5, "received": 5, "ack sent": 5, "acknowledged": 5}
    for relay in ("root", "coordinator"):
        counts = actions(relay)
        assert counts["delegated"] == counts["completed"] == counts["reply sent"] == 5, counts
        assert counts["received"] == counts["ack sent"] == 10, counts  # requests and answers
    assert actions("spec_a") == {
        "received": 5,
        "ack sent": 5,
        "started": 5,
        "reply sent": 5,
        "completed": 5,
        "acknowledged": 4,
    }
