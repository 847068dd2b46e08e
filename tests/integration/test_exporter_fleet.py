"""`vox exporter` over a real fleet of daemons, checked by promtool and a real Prometheus."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.promkit import Exporter, poll, run_exporter, run_prometheus, sample
from vox_mqtt.console.operator import ALL_STATUS, OperatorConsole
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.errors import CommandFailed

pytestmark = pytest.mark.slow

SHAPE = {"root": None, "worker": "root"}
ROLES = {"worker": ["tests.kits.agentkit:Analyst", "tests.kits.agentkit:Slow"]}
KEEPALIVE = 5
# docs/liveness.md: a killed process's will is published at once; a silent host's after
# about 1.5 x keepalive plus Mosquitto's check period. The bound covers the slower case.
LIVENESS_BOUND = 1.5 * KEEPALIVE + 5


async def send_commands(procs: FleetProcesses) -> dict[str, int]:
    """Send 3 analyze (served by worker), 1 boom (handler error), 2 unknown (NO_ROUTE)."""
    outcomes = {"ok": 0, "HANDLER_ERROR": 0, "NO_ROUTE": 0}
    async with OperatorConsole(procs.operator_config, observe=[ALL_STATUS]) as console:
        async with asyncio.timeout(30):
            while True:
                root = console.view.get(console.root_id)
                if root is not None and root.healthy and "boom" in root.commands:
                    break
                await asyncio.sleep(0.05)
        for command, params in [
            ("analyze", {"target": "a"}),
            ("analyze", {"target": "bb"}),
            ("boom", {}),
            ("nope", {}),
            ("analyze", {"target": "ccc"}),
            ("nope", {}),
        ]:
            try:
                await console.send_command(command, params, wait=20)
                outcomes["ok"] += 1
            except CommandFailed as exc:
                outcomes[exc.code] += 1
    return outcomes


def check_counts(exporter: Exporter) -> bool:
    """Return whether the exporter shows exactly what send_commands did (after a heartbeat)."""
    s = exporter.samples()

    def at(name: str, agent: str, **labels: str) -> float | None:
        return sample(s, name, agent=agent, **labels)

    expected = {
        ("vox_agent_messages_in_total", "root", ("type", "command_request")): 6,
        ("vox_agent_messages_in_total", "root", ("type", "command_result")): 3,
        ("vox_agent_messages_in_total", "root", ("type", "command_error")): 1,
        ("vox_agent_commands_delegated_total", "root", ("command", "analyze")): 3,
        ("vox_agent_commands_delegated_total", "root", ("command", "boom")): 1,
        ("vox_agent_commands_failed_total", "root", ("code", "NO_ROUTE")): 2,
        ("vox_agent_commands_failed_total", "root", ("code", "HANDLER_ERROR")): 1,
        ("vox_agent_command_roundtrip_seconds_count", "root", None): 4,
        ("vox_agent_messages_in_total", "worker", ("type", "command_request")): 4,
        ("vox_agent_messages_out_total", "worker", ("type", "command_result")): 3,
        ("vox_agent_messages_out_total", "worker", ("type", "command_error")): 1,
        ("vox_agent_commands_served_total", "worker", ("command", "analyze")): 3,
        ("vox_agent_commands_served_total", "worker", ("command", "boom")): 1,
        ("vox_agent_commands_failed_total", "worker", ("code", "HANDLER_ERROR")): 1,
        ("vox_agent_command_handler_seconds_count", "worker", None): 4,
        ("vox_agent_rejected_total", "worker", None): None,  # nothing rejected: no series
    }
    for (name, agent, label), value in expected.items():
        labels = dict([label]) if label else {}
        if at(name, agent, **labels) != value:
            return False
    return True


def test_exporter_counts_exactly_what_the_fleet_did(tmp_path: Path) -> None:
    text = fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)
    with run_fleet(tmp_path / "fleet", text, keepalive=KEEPALIVE) as procs:
        # The read-only explorer identity: the broker lets it read vox/# and write nothing.
        explorer = render_agent_config(
            procs.fleet, "explorer", procs.broker_dir.root, tmp_path / "etc" / "explorer.toml"
        ).config
        with run_exporter(explorer, tmp_path / "exporter.log") as exporter:
            check_fleet(procs, exporter)


def check_fleet(procs: FleetProcesses, exporter: Exporter) -> None:
    """Commands in, exact counts out, promtool, then a kill and up 0."""
    ids = {a.name: str(a.id) for a in procs.fleet}
    poll(
        lambda: all(sample(exporter.samples(), "vox_agent_up", agent=n) == 1.0 for n in SHAPE),
        30,
        "every agent up",
    )
    outcomes = asyncio.run(send_commands(procs))
    assert outcomes == {"ok": 3, "HANDLER_ERROR": 1, "NO_ROUTE": 2}
    poll(lambda: check_counts(exporter), 15, "the counts in a heartbeat")
    time.sleep(2.5)  # two more heartbeats: the counts stay exact, nothing counted twice
    assert check_counts(exporter), exporter.text()

    body = exporter.text()
    s = exporter.samples()
    worker = sample(s, "vox_agent_up", agent="worker", id=ids["worker"], master="root")
    assert worker == 1.0
    assert sample(s, "vox_agent_up", agent="root", master="operator") == 1.0
    assert sample(s, "vox_agent_epoch", agent="worker") == 1.0
    assert (sample(s, "vox_agent_ledger_records_total", agent="worker") or 0) > 0
    assert (sample(s, "vox_agent_ledger_bytes", agent="worker") or 0) > 0
    assert (sample(s, "vox_agent_process_resident_memory_bytes", agent="root") or 0) > 0
    assert sample(s, "vox_exporter_broker_connected") == 1.0
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make test` installs Debian's prometheus"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # A killed daemon: its will reaches the exporter, the next scrape says up 0.
    procs.agents["worker"].kill()
    took = poll(
        lambda: sample(exporter.samples(), "vox_agent_up", agent="worker") == 0.0,
        LIVENESS_BOUND + 2,
        "worker up 0",
        every=0.1,
    )
    assert took <= LIVENESS_BOUND
    s = exporter.samples()
    assert sample(s, "vox_agent_status", agent="worker", state="INACTIVE") == 1.0
    # The root's alert for its lost child is in the war room.
    poll(
        lambda: (
            sample(
                exporter.samples(),
                "vox_warroom_open_incidents",
                severity="CRITICAL",
                code="VM_CONNECTION_LOST",
            )
            == 1.0
        ),
        10,
        "the war-room incident",
    )


def test_a_real_prometheus_scrapes_the_exporter(tmp_path: Path) -> None:
    text = fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)
    with (
        run_fleet(tmp_path / "fleet", text, keepalive=KEEPALIVE) as procs,
        run_exporter(procs.operator_config, tmp_path / "exporter.log") as exporter,
        run_prometheus(tmp_path / "prom", exporter.url.split("/")[2]) as prom,
    ):
        poll(
            lambda: prom.value('count(vox_agent_up{job="vox"} == 1)') == 2.0,
            40,
            "Prometheus sees both agents up",
        )
        # The operator's config: the exporter logged in as the operator's own read-only look.
        look = procs.broker_dir.credentials_for(procs.fleet.operator_name).look("exporter")
        assert look is not None
        assert f"u'{look.username}'" in procs.broker.log_tail(400)
        assert sorted(prom.rules_loaded()) == sorted(
            [
                "VoxAgentDown",
                "VoxExporterBlind",
                "VoxWarRoomOpen",
                "VoxCommandErrorRate",
                "VoxRejectedMessages",
            ]
        )
        series = 'vox_agent_messages_in_total{agent="worker",type="command_request"}'
        window = 60
        # A few scrapes of the idle counters before the work starts (rate() below needs them).
        poll(
            lambda: (
                prom.value(f"max_over_time({series}[{window}s])") == 0.0
                and (prom.value(f"count_over_time({series}[{window}s])") or 0) >= 5
            ),
            30,
            "Prometheus has scraped the worker's idle counter 5 times",
        )
        outcomes = asyncio.run(send_commands(procs))
        assert outcomes == {"ok": 3, "HANDLER_ERROR": 1, "NO_ROUTE": 2}
        # Each agent's counts reach Prometheus in its own heartbeat: wait for both.
        no_route = 'vox_agent_commands_failed_total{agent="root",code="NO_ROUTE"}'
        poll(
            lambda: prom.value(series) == 4.0 and prom.value(no_route) == 2.0,
            20,
            "Prometheus has the worker's 4 requests and the root's 2 NO_ROUTE",
        )
        # Exactly the four commands the worker received happened inside the window ...
        spread = prom.value(
            f"max_over_time({series}[{window}s]) - min_over_time({series}[{window}s])"
        )
        assert spread == 4.0
        # ... and rate() over it says the same, within Prometheus' edge extrapolation.
        rate = prom.value(f"rate({series}[{window}s])")
        assert rate is not None
        assert abs(rate * window - 4.0) <= 1.0, rate
        assert prom.value(no_route) == 2.0
        assert prom.value('vox_agent_up{agent="worker"}') == 1.0

        procs.agents["worker"].kill()
        poll(
            lambda: prom.value('vox_agent_up{agent="worker"}') == 0.0,
            LIVENESS_BOUND + 5,
            "Prometheus sees the worker down",
        )
        assert prom.value('vox_agent_up{agent="root"}') == 1.0


def test_exporter_survives_a_broker_restart(tmp_path: Path) -> None:
    text = fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)
    with (
        run_fleet(tmp_path / "fleet", text, keepalive=KEEPALIVE) as procs,
        run_exporter(procs.operator_config, tmp_path / "exporter.log") as exporter,
    ):

        def all_up() -> bool:
            s = exporter.samples()
            return all(sample(s, "vox_agent_up", agent=n) == 1.0 for n in SHAPE)

        poll(all_up, 30, "every agent up")
        procs.broker.stop()
        # Blind, and says so: the alert rules tell this apart from a fleet outage.
        poll(
            lambda: sample(exporter.samples(), "vox_exporter_broker_connected") == 0.0,
            20,
            "the exporter to notice the broker is gone",
        )
        procs.broker.start()
        poll(
            lambda: sample(exporter.samples(), "vox_exporter_broker_connected") == 1.0,
            40,
            "the exporter back on the broker",
        )
        poll(all_up, 40, "every agent up again after the restart")
        assert exporter.process.poll() is None
