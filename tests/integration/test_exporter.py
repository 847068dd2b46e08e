"""The exporter's metric families, from statuses an observer read, checked by promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vox_mqtt.cli import main
from vox_mqtt.cli.exporter import parse_listen
from vox_mqtt.cli.statusview import activity
from vox_mqtt.console.exporter import FleetCollector
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize
from vox_mqtt.transport.session import Inbound

OPERATOR = uuid4()


def status(
    agent: UUID, master: UUID, name: str, state: str, *, metrics: dict[str, Any], epoch: int = 1
) -> Inbound:
    report = AgentStatus(
        name=name,
        status="ACTIVE" if state == "ACTIVE" else "INACTIVE",
        error_code=None if state == "ACTIVE" else "VM_CONNECTION_LOST",
        epoch=epoch,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        metrics=metrics,
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=master, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=False)


def incident(source: UUID, subject: UUID, code: str, *, resolved: bool = False) -> Inbound:
    failure = SystemFailure(
        error_code=code, severity="CRITICAL", description="lost", resolved=resolved
    )
    message = new_message(
        MSG_SYSTEM_FAILURE, source=source, target=topics.WARROOM_ID, details=failure
    )
    return Inbound(topic=topics.warroom(source, subject), payload=serialize(message), retain=True)


def scrape(collector: FleetCollector) -> tuple[str, dict[tuple[str, tuple[Any, ...]], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def test_families_carry_agent_labels_counters_histograms_and_incidents(tmp_path: Path) -> None:
    root, child = uuid4(), uuid4()
    metrics = AgentMetrics()
    metrics.messages_in.inc("command_request", 5)
    metrics.commands_failed.inc("NO_ROUTE", 2)
    metrics.duplicates += 1
    metrics.command_handler_seconds.observe(0.02)
    metrics.command_handler_seconds.observe(3.0)
    metrics.gauge("inflight_commands", lambda: 2)
    observer = FleetObserver()
    host = {"cpu_percent": 10.0, "process_rss_bytes": 1234, "memory_percent": "x"}
    observer.take(status(root, OPERATOR, "root", "ACTIVE", metrics=host | {"agent": {"v": 1}}))
    observer.take(
        status(child, root, "worker", "ACTIVE", metrics=host | {"agent": metrics.snapshot()})
    )
    observer.take(incident(root, child, "VM_CONNECTION_LOST"))
    collector = FleetCollector(observer, names={OPERATOR: "operator"})

    text, samples = scrape(collector)
    w = (("agent", "worker"), ("id", str(child)), ("master", "root"))
    r = (("agent", "root"), ("id", str(root)), ("master", "operator"))
    assert samples[("vox_agent_up", w)] == 1.0
    assert samples[("vox_agent_up", r)] == 1.0
    assert samples[("vox_agent_status", tuple(sorted((*w, ("state", "ACTIVE")))))] == 1.0
    assert samples[("vox_agent_status", tuple(sorted((*w, ("state", "STALE")))))] == 0.0
    assert samples[("vox_agent_epoch", w)] == 1.0
    assert (
        samples[("vox_agent_messages_in_total", tuple(sorted((*w, ("type", "command_request")))))]
        == 5
    )
    assert (
        samples[("vox_agent_commands_failed_total", tuple(sorted((*w, ("code", "NO_ROUTE")))))] == 2
    )
    assert samples[("vox_agent_duplicates_total", w)] == 1
    assert samples[("vox_agent_inflight_commands", w)] == 2
    assert samples[("vox_agent_command_handler_seconds_count", w)] == 2
    assert (
        samples[("vox_agent_command_handler_seconds_bucket", tuple(sorted((*w, ("le", "0.025")))))]
        == 1
    )
    assert (
        samples[("vox_agent_command_handler_seconds_bucket", tuple(sorted((*w, ("le", "+Inf")))))]
        == 2
    )
    assert samples[("vox_host_cpu_percent", w)] == 10.0
    assert samples[("vox_agent_process_resident_memory_bytes", w)] == 1234
    assert ("vox_host_memory_percent", w) not in samples  # not a number: left out
    assert ("vox_agent_duplicates_total", r) not in samples  # an empty snapshot: no series
    key = ("vox_warroom_open_incidents", (("code", "VM_CONNECTION_LOST"), ("severity", "CRITICAL")))
    assert samples[key] == 1

    # The child dies (its will), the incident resolves: up 0, incident series 0, not gone.
    observer.take(status(child, root, "worker", "INACTIVE", metrics={}))
    observer.take(incident(root, child, "VM_CONNECTION_LOST", resolved=True))
    text, samples = scrape(collector)
    assert samples[("vox_agent_up", w)] == 0.0
    assert samples[("vox_agent_status", tuple(sorted((*w, ("state", "INACTIVE")))))] == 1.0
    assert samples[key] == 0
    # The last counters stay visible after death (the will carries no metrics).
    assert samples[("vox_agent_duplicates_total", w)] == 1
    promtool_check(text, tmp_path)


def promtool_check(text: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: `make test` installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_listen_address_parsing() -> None:
    assert parse_listen("127.0.0.1:9733") == ("127.0.0.1", 9733)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9733", ":9733", "host:port", "h:70000"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


def test_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: `make test` installs Debian's prometheus"
    rules = Path(__file__).resolve().parents[2] / "docs" / "vox-alerts.yml"
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


def test_agents_are_not_called_down_while_the_exporter_is_blind(tmp_path: Path) -> None:
    # promtool's rule unit tests: the same series, with and without the broker behind them.
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: `make test` installs Debian's prometheus"
    rules = Path(__file__).resolve().parents[2] / "docs" / "vox-alerts.yml"
    labels = {"agent": "spec_a", "id": "1d2c", "master": "root"}
    down = {
        "alertname": "VoxAgentDown",
        "exp_alerts": [
            {
                "exp_labels": {"severity": "critical", **labels},
                "exp_annotations": {
                    "summary": "vox agent spec_a is down",
                    "description": "spec_a (id 1d2c, master root) has not been ACTIVE for a "
                    "minute. `vox status` and `vox warroom` say why.",
                },
            }
        ],
    }

    def case(connected: int, expected: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "interval": "15s",
            "input_series": [
                {
                    "series": 'vox_agent_up{agent="spec_a",id="1d2c",master="root"}',
                    "values": "0x10",
                },
                {"series": "vox_exporter_broker_connected", "values": f"{connected}x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "VoxAgentDown", **e} for e in expected
            ],
        }

    spec = {
        "rule_files": [str(rules)],
        "tests": [case(1, [{"exp_alerts": down["exp_alerts"]}]), case(0, [{"exp_alerts": []}])],
    }
    unit = tmp_path / "alerts-test.yml"
    unit.write_text(json.dumps(spec), encoding="utf-8")  # JSON is YAML
    result = subprocess.run(
        [promtool, "test", "rules", str(unit)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_status_columns_from_a_heartbeat() -> None:
    metrics = AgentMetrics(clock=iter([0.0, 2.0]).__next__)
    metrics.messages_in.inc("command_request", 4)
    metrics.commands_failed.inc("NO_ROUTE")
    metrics.rejected.inc("INVALID_MESSAGE")
    for seconds in (0.002, 0.003, 0.004, 0.2):
        metrics.command_handler_seconds.observe(seconds)
    rate, errors, p50 = activity({"cpu_percent": 1.0, "agent": metrics.snapshot()})
    assert (rate, errors) == ("2.0", "2")
    assert p50 == "3.8ms"  # one of four at or below 2.5 ms, two in (2.5, 5] ms: linear in it
    assert activity({"cpu_percent": 1.0}) == ("-", "-", "-")


def test_a_hostile_heartbeat_cannot_blow_up_a_scrape() -> None:
    agent = uuid4()
    hostile = {
        "v": 1,
        # Under the 256 KiB message limit, which bounds a status message first.
        "counters": {"messages_in": {f"type-{i}": i for i in range(5_000)}},
        "histograms": {
            "command_handler_seconds": {"le": list(range(5000)), "counts": [1] * 5001, "sum": 1}
        },
    }
    observer = FleetObserver()
    observer.take(status(agent, OPERATOR, "mallory", "ACTIVE", metrics={"agent": hostile}))
    text, samples = scrape(FleetCollector(observer))
    assert sum(1 for name, _ in samples if name == "vox_agent_messages_in_total") == 32
    assert not any(name.startswith("vox_agent_command_handler_seconds") for name, _ in samples)
    assert len(text) < 20_000


def test_bad_config_or_address_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.toml")
    assert main(["exporter", "--config", missing, "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vox: error: ")
    assert err.count("\n") == 1
    assert "nope.toml" in err
    assert main(["exporter", "--config", missing, "--listen", "localhost"]) == 2
    err = capsys.readouterr().err
    assert err == "vox: error: --listen 'localhost' is not HOST:PORT (e.g. 127.0.0.1:9733)\n"
