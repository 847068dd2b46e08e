"""What the operator sees on a real fleet of `vox-agent` daemons (issue 39, items 2, 3, 5).

One fleet with long names, shared by the module: a wrong parameter is the operator's
(INVALID_PARAMS, no traceback anywhere), `vox status` fits 80 columns, `vox watch` prints
lines into a pipe, and, last because it kills, a command whose specialists are all down
is answered TARGET_INACTIVE.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, fleet_text, run_fleet
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol.topics import STATUS_FILTER

pytestmark = pytest.mark.slow

COORDINATOR = "coordinator_for_the_northern_region_of_the_fleet"
SPEC_A = "specialist_analyst_with_a_rather_long_name_a"
SPEC_B = "specialist_analyst_with_a_rather_long_name_b"
SHAPE = {"root": None, COORDINATOR: "root", SPEC_A: COORDINATOR, SPEC_B: COORDINATOR}
VOX = [sys.executable, "-m", "vox_mqtt.cli"]
ESSENTIAL_HEADERS = ["name", "state", "age", "incidents", "commands"]
ROLES = {
    "root": ["examples.freelance:Root"],
    COORDINATOR: ["examples.freelance:Coordinator"],
    SPEC_A: ["examples.freelance:Analyst"],
    SPEC_B: ["examples.freelance:Analyst"],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcesses]:
    tmp = tmp_path_factory.mktemp("views")
    with run_fleet(tmp, fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)) as procs:

        async def routed() -> None:
            async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
                async with asyncio.timeout(60):
                    while True:
                        root = console.view.get(console.root_id)
                        if root is not None and root.healthy and "analyze" in root.commands:
                            return
                        await asyncio.sleep(0.1)

        asyncio.run(routed())
        yield procs


def vox(
    *args: str | Path, columns: int | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = child_env()
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [*VOX, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        check=False,
    )


def no_traceback_anywhere(procs: FleetProcesses) -> None:
    for agent in procs.agents.values():
        assert "Traceback" not in agent.log(), f"{agent.name}:\n{agent.log()}"


# --- item 5: operator mistakes are the operator's -----------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["analyze"],
            "analyze: INVALID_PARAMS: parameter 'target' is missing (expected a string)",
        ),
        (
            ["analyze", "target=7"],
            "analyze: INVALID_PARAMS: parameter 'target' should be a valid string, not 7",
        ),
        (
            ["financial_summary", "start_date=2026-01-01", "end_date=2026-02-01T00:00:00Z"],
            "financial_summary: INVALID_PARAMS: parameter 'start_date': '2026-01-01' has no "
            "timezone (write e.g. 2026-01-11T08:00:00-03:00)",
        ),
        (
            [
                "financial_summary",
                "start_date=2026-03-01T00:00:00Z",
                "end_date=2026-02-01T00:00:00Z",
            ],
            "financial_summary: INVALID_PARAMS: end_date 2026-02-01T00:00:00Z is before "
            "start_date 2026-03-01T00:00:00Z",
        ),
    ],
)
def test_a_wrong_parameter_is_refused_in_one_line_with_no_traceback(
    fleet: FleetProcesses, args: list[str], line: str
) -> None:
    done = vox("send", "--config", fleet.operator_config, *args, "--timeout", "30")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("vox: error: " + line), done.stderr
    # Neither the role class nor the specialist that holds the command is named above it.
    for hidden in ("Analyst", "Root.", SPEC_A, SPEC_B, COORDINATOR, "Traceback"):
        assert hidden not in done.stderr
    no_traceback_anywhere(fleet)
    assert "HANDLER_ERROR" not in fleet.agents["root"].log()


def test_the_right_parameters_still_work(fleet: FleetProcesses) -> None:
    done = vox("send", "--config", fleet.operator_config, "analyze", "target=x.pdf", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"kind": "file name (.pdf)"' in done.stdout


# --- item 3: terminals of every width -------------------------------------------------------

NAMES = list(SHAPE)


def test_status_at_80_columns_shows_every_agent_and_the_essentials(fleet: FleetProcesses) -> None:
    done = vox("status", "--config", fleet.operator_config, columns=80)
    assert done.returncode == 0, done.stderr
    title, header, *rows = done.stdout.splitlines()
    assert title == "vox fleet status, as seen by operator (operator)"
    assert all(cell_len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    # Whole columns only: these five always, in this order, whatever else fits.
    shown = header.split()
    assert [w for w in shown if w in ESSENTIAL_HEADERS] == ESSENTIAL_HEADERS, header
    assert len(rows) == len(NAMES)
    for row, name in zip(rows, sorted(NAMES), strict=True):
        # A name too long for its column is cut in its middle: both ends still show.
        assert row.startswith(name[:8]), (row, name)
        assert name[-4:] in row.split("  ")[0], (row, name)
        assert " ACTIVE " in row
        assert "ago" in row
    root = next(row for row in rows if row.startswith("root "))
    assert "command" in root or "analyze" in root


def test_status_wide_shows_every_column_and_whole_names(fleet: FleetProcesses) -> None:
    done = vox("status", "--config", fleet.operator_config, "--wide", columns=80)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[1]
    for word in ("name", "state", "code", "age", "incidents", "in flight", "epoch", "msg/s"):
        assert word in header
    for word in ("p50 cmd", "cpu%", "rss", "host cpu%", "host mem%", "disk%", "id", "commands"):
        assert word in header
    for spec in fleet.fleet:
        assert spec.name in done.stdout
        assert str(spec.id) in done.stdout
    assert "analyze, financial_summary" in done.stdout


def test_watch_into_a_pipe_prints_lines_and_under_timeout_too(fleet: FleetProcesses) -> None:
    done = vox("watch", "--config", fleet.operator_config, "--duration", "1", columns=80)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("vox watch: 4 agent(s) as seen by operator (operator)"), lines
    for name in NAMES:
        assert any(f" {name} ACTIVE (" in line for line in lines[1:]), (name, lines)
    # Killed by `timeout`, it has said what it saw already: nothing waits for an exit.
    timed = subprocess.run(
        ["timeout", "4", *VOX, "watch", "--config", str(fleet.operator_config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=REPO,
        check=False,
    )
    assert timed.returncode == 124, timed.stderr
    assert sum(f"{name} ACTIVE" in timed.stdout for name in NAMES) == len(NAMES), timed.stdout


# --- item 2b, last: it kills both specialists ------------------------------------------------


def test_a_command_whose_specialists_are_all_down_is_target_inactive_naming_the_level(
    fleet: FleetProcesses,
) -> None:
    fleet.agents[SPEC_A].kill()
    fleet.agents[SPEC_B].kill()

    async def root_reports_analyze_down() -> None:
        # The wills fire after the keepalive; the coordinator then reports `analyze` down and
        # the root, which no longer advertises it, does too (docs/liveness.md).
        async with OperatorConsole(fleet.operator_config, observe=[STATUS_FILTER]) as console:
            async with asyncio.timeout(60):
                while True:
                    root = console.view.get(console.root_id)
                    if root is not None and "analyze" in root.commands_down:
                        assert "analyze" not in root.commands
                        return
                    await asyncio.sleep(0.1)

    asyncio.run(root_reports_analyze_down())
    done = vox("send", "--config", fleet.operator_config, "analyze", "target=x", "--timeout", "30")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(
        "vox: error: analyze: TARGET_INACTIVE: every agent that serves 'analyze' below "
        f"{COORDINATOR} is down (INACTIVE or STALE)"
    ), done.stderr
    assert "NO_ROUTE" not in done.stderr
    # The specialists that hold it are the coordinator's to name, not the root's.
    assert SPEC_A not in done.stderr
    assert SPEC_B not in done.stderr
    # A command nobody ever served is still a typo.
    typo = vox("send", "--config", fleet.operator_config, "analyse", "target=x")
    assert "NO_ROUTE" in typo.stderr, typo.stderr


# --- item 2a, the watch's part, last of all: it stops the broker ------------------------------


def test_watch_says_unknown_since_for_every_agent_while_its_broker_link_is_down(
    fleet: FleetProcesses,
) -> None:
    watch = subprocess.Popen(
        [*VOX, "watch", "--config", str(fleet.operator_config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        cwd=REPO,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in watch.stdout or ():
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    everything: list[str] = []

    def until(wanted: str, timeout: float = 60) -> list[str]:
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while not any(wanted in line for line in seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no {wanted!r} in {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=min(left, 1.0)))
                everything.append(seen[-1])
        return seen

    try:
        until("root ")  # the fleet as it is, printed at once
        fleet.broker.stop()
        down = until("broker link down since")
        banner = down[-1]
        since = banner.split("broker link down since ")[1].split(",")[0]
        # The banner first, then every agent: unknown since then, no state and no age.
        after = [until(f"{name} unknown since {since}", 10)[-1] for name in NAMES]
        for line in after:
            assert "ACTIVE" not in line
            assert "ago" not in line
        fleet.broker.start()
        back = until("broker link back", 60)
        assert back[-1].rstrip().endswith(" broker link back")
    finally:
        watch.terminate()
        watch.wait(10)
        reader.join(10)
        if watch.stdout is not None:
            watch.stdout.close()
    while not lines.empty():
        everything.append(lines.get())
    assert not [line for line in everything if "Traceback" in line], everything
