"""`vox exporter` serves /metrics whether or not the broker answers (docs/metrics.md)."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.promkit import Exporter, poll, run_exporter, sample
from vox_mqtt.cli import main
from vox_mqtt.fleet.bundles import render_agent_config

pytestmark = pytest.mark.slow

SHAPE = {"root": None, "worker": "root"}
RECONNECT_MAX = 0.5  # the exporter's longest wait between two tries (a look's default: 5 s)


def quick_to_retry(config: Path, connect_timeout: float) -> None:
    """Let the exporter say why its first connection is not up after connect_timeout seconds
    (5 s by default) and try again at least every RECONNECT_MAX seconds."""
    text = config.read_text()
    broker = f"[broker]\nconnect_timeout = {connect_timeout}\nreconnect_min = 0.1\n"
    broker += f"reconnect_max = {RECONNECT_MAX}\n"
    assert "[broker]\n" in text, text
    config.write_text(text.replace("[broker]\n", broker, 1))


def connected(exporter: Exporter) -> float | None:
    return sample(exporter.samples(), "vox_exporter_broker_connected")


def test_no_broker_at_start_then_the_broker_comes(tmp_path: Path) -> None:
    with run_fleet(tmp_path / "fleet", fleet_text(SHAPE), start=False) as procs:
        procs.broker.stop()  # the port stays the rendered one: the broker comes back on it
        quick_to_retry(procs.operator_config, 1)  # a refused socket is said at once
        with run_exporter(procs.operator_config, tmp_path / "exporter.log") as exporter:
            # Scrapeable at once: the exporter is up, its broker session is not.
            s = exporter.samples()
            assert sample(s, "vox_exporter_broker_connected") == 0.0
            assert not [name for name, _ in s if name.startswith("vox_agent_")]
            poll(lambda: "retrying" in exporter.log(), 20, "the line saying why")
            # Four reconnect_max periods: more failed tries (nothing to count them by while
            # nothing listens), and the cause said once.
            time.sleep(4 * RECONNECT_MAX)
            log = exporter.log()
            assert log.count("connection refused") == 1, log
            line = next(x for x in log.splitlines() if "connection refused" in x)
            assert line.startswith("vox exporter: not connected to ")
            assert "serving vox_exporter_broker_connected 0" in line
            assert "Traceback" not in log
            assert connected(exporter) == 0.0
            code, body = exporter.health()
            assert code == 503
            assert body["broker"] == "disconnected"
            assert "no broker session" in body["reason"]

            procs.broker.start()
            procs.start_all()
            poll(lambda: connected(exporter) == 1.0, 30, "the exporter on the broker")

            def all_up() -> bool:
                s = exporter.samples()
                return all(sample(s, "vox_agent_up", agent=n) == 1.0 for n in SHAPE)

            poll(all_up, 30, "every agent up")
            code, body = exporter.health()
            assert code == 200
            assert body["status"] == "ok"
            assert body["by_state"].get("ACTIVE") == len(SHAPE)
            assert "vox exporter: connected to the broker at " in exporter.log()
            assert exporter.process.poll() is None


def refusals(procs: FleetProcesses) -> int:
    """Return how many logins the broker has refused."""
    return procs.broker.log_text().count("disconnected, not authorised")


def test_refused_credentials_serve_0_and_say_why_once(tmp_path: Path) -> None:
    with run_fleet(tmp_path / "fleet", fleet_text(SHAPE), start=False) as procs:
        explorer = render_agent_config(
            procs.fleet, "explorer", procs.broker_dir.root, tmp_path / "etc" / "explorer.toml"
        ).config
        secrets = [p for p in explorer.parent.rglob("*credentials*.toml")]
        assert len(secrets) == 1, secrets
        text = secrets[0].read_text()
        secrets[0].write_text(re.sub(r'(?m)^password = ".*"$', 'password = "wrong"', text))
        # Room for the broker's first refusal to come before the line that says why.
        quick_to_retry(explorer, 2)
        with run_exporter(explorer, tmp_path / "exporter.log") as exporter:
            assert connected(exporter) == 0.0
            poll(lambda: "retrying" in exporter.log(), 20, "the line saying why")
            # More refused tries, as the broker logs them (nothing else logs in): said once.
            before = refusals(procs)
            poll(lambda: refusals(procs) >= before + 2, 30, "two more refused tries")
            log = exporter.log()
            assert log.count("refused the credentials") == 1, log
            line = next(x for x in log.splitlines() if "refused the credentials" in x)
            assert line.startswith("vox exporter: error: ")
            assert "Traceback" not in log
            assert connected(exporter) == 0.0
            assert exporter.process.poll() is None


def test_a_listen_address_in_use_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with run_fleet(tmp_path / "fleet", fleet_text(SHAPE), start=False) as procs:
        procs.broker.stop()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            args = ["exporter", "--config", str(procs.operator_config)]
            assert main([*args, "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err == f"vox: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
