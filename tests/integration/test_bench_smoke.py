"""Each benchmark runs once at tiny size and yields numbers with the expected keys.

No assertion here is about speed: benchmarks measure, tests only keep them from rotting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import tomllib
from contextlib import AsyncExitStack
from pathlib import Path

import psutil
import pytest

from bench.__main__ import FIGURES, main
from bench.common import SEED_SHAPE, bench_broker, fleet_text
from bench.deployed import AgentProcess, start_deployed
from bench.one_hop import raw_round_trips
from bench.voxside import LEDGER_SYNC_ENV, seed_role_specs
from tests.kits.benchsmoke import run_figure


# Figure 16 (scale) runs in tests/integration/test_bench_smoke_scale.py: a module of its
# own, so that the suite's workers take it beside this one (pytest -n, --dist loadfile).
@pytest.mark.parametrize("name", [n for n in FIGURES if n != "scale"])
def test_each_figure_runs_at_tiny_size(name: str, tmp_path: Path) -> None:
    run_figure(name, tmp_path)


def test_profile_of_the_throughput_figure_names_where_time_goes(tmp_path: Path) -> None:
    rows = FIGURES["throughput"][1](tmp_path, True)
    assert isinstance(rows, list)
    row, deployed = rows
    # The process-per-agent row sums the CPU of every agent daemon and of the operator.
    detail = deployed["vox_detail"]
    assert detail["agent_processes"] == 4
    assert detail["cpu_ms_per_command_agents"] > 0
    assert detail["cpu_ms_per_command_python"] == pytest.approx(
        detail["cpu_ms_per_command_agents"] + detail["cpu_ms_per_command_operator"], abs=0.002
    )
    assert sum(detail["served_by_specialist"].values()) > 0, detail
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


def test_the_obligations_floor_records_every_message_and_acknowledges_every_request(
    tmp_path: Path,
) -> None:
    # The floor in figures 1 and 2 claims the guarantees' own cost: it must really pay it.
    chain = ["operator", "root", "coordinator", "spec_a"]
    with bench_broker(tmp_path, fleet_text(SEED_SHAPE)) as bench:
        times = asyncio.run(raw_round_trips(bench, chain, 4, 1, durable=True))
    assert len(times) == 4

    def actions(name: str) -> dict[str, int]:
        with sqlite3.connect(tmp_path / f"journal-4-{name}.db") as db:
            found = db.execute("SELECT action, COUNT(*) FROM log GROUP BY action").fetchall()
        return dict(found)

    # No answer is acknowledged (docs/messages.md): the floor follows the same rule as VOX.
    assert actions("operator") == {"sent": 5, "received": 5, "acknowledged": 5}
    for relay in ("root", "coordinator"):
        counts = actions(relay)
        assert counts["delegated"] == counts["completed"] == counts["reply sent"] == 5, counts
        assert counts["received"] == 10, counts  # requests and answers
        assert counts["ack sent"] == 5, counts  # the requests alone
    # Its quick answer stands for its acknowledgement, as VOX's does for an idempotent command.
    assert actions("spec_a") == {"received": 5, "started": 5, "reply sent": 5, "completed": 5}


def _completed(ledger: Path) -> int:
    with sqlite3.connect(ledger) as db:
        return int(db.execute("SELECT COUNT(*) FROM logs WHERE action = 'completed'").fetchone()[0])


def test_the_process_per_agent_layout_runs_a_daemon_per_agent_and_reaps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEDGER_SYNC_ENV, "normal")
    names = ["root", "coordinator", "spec_a"]
    started: dict[str, AgentProcess] = {}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            operator, daemons = await start_deployed(stack, bench, names)
            started.update(daemons)
            reply = await operator.request("echo", {"text": "hi"}, to=bench.id("root"))
            assert reply.details["result"] == {"text": "hi"}, reply.details
            for daemon in daemons.values():
                assert daemon.process.poll() is None
                assert daemon.pid != os.getpid()
            # The specialist's own daemon ran it: its ledger says so.
            assert _completed(daemons["spec_a"].ledger) == 1

    with bench_broker(tmp_path, fleet_text(SEED_SHAPE, roles=seed_role_specs())) as bench:
        asyncio.run(scenario())
    assert set(started) == set(names)
    assert _daemons_alive() == []
    for name, daemon in started.items():
        assert daemon.process.returncode == 0, daemon.log_tail()  # stopped cleanly, reaped
        config = tomllib.loads(daemon.config.read_text())
        assert config["agent"]["ledger_sync"] == "normal"
        assert config["agent"]["roles"] == seed_role_specs().get(name, [])


def test_a_daemon_that_cannot_start_is_reported_with_its_log_and_all_are_reaped(
    tmp_path: Path,
) -> None:
    roles = {**seed_role_specs(), "root": ["bench.voxside:NoSuchRole"]}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            await start_deployed(stack, bench, ["root", "coordinator", "spec_a"])

    with (
        bench_broker(tmp_path, fleet_text(SEED_SHAPE, roles=roles)) as bench,
        pytest.raises(RuntimeError, match="the root daemon exited") as failed,
    ):
        asyncio.run(scenario())
    assert "NoSuchRole" in str(failed.value)  # its log, quoted in the error
    assert _daemons_alive() == []  # the coordinator's and spec_a's daemons were stopped too


def _daemons_alive() -> list[psutil.Process]:
    """Return this process's children that are still running a `vox-agent` daemon."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "agent_daemon" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found
