"""`vox-agent --check --login`: a real login and inbox subscription, and no takeover."""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest

from tests.kits.brokerkit import Client
from tests.kits.fleetproc import REPO, AgentProcess, child_env
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.pki import PkiLayout, init_pki
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

pytestmark = pytest.mark.slow


@dataclass
class Site:
    fleet: Fleet
    broker_dir: BrokerDir
    broker: LocalBroker
    config: Path
    daemon: AgentProcess


@pytest.fixture
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    """The root's daemon config on a rendered broker; client ids locked unless param False."""
    fleet = parse_fleet(
        f'[operator]\nid = "{uuid4()}"\n\n[[agents]]\nname = "root"\nid = "{uuid4()}"\n'
    )
    broker_dir = render_broker_dir(
        fleet,
        tmp_path / "broker",
        port=free_port(),
        run_as_user=getpass.getuser(),
        lock_client_ids=getattr(request, "param", True),
    )
    config = render_agent_config(
        fleet, "root", broker_dir.root, tmp_path / "etc" / "root.toml", tmp_path / "state"
    ).config
    broker = LocalBroker(broker_dir.conf, port=broker_dir.port)
    daemon = AgentProcess("root", config, tmp_path / "state", tmp_path / "root.log")
    try:
        yield Site(fleet, broker_dir, broker, config, daemon)
    finally:
        daemon.stop()
        broker.stop()


def check_login(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_daemon",
            "--config",
            str(config),
            *(flags or ("--check", "--login")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=child_env(),
        check=False,
    )


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """Return the one error line of a failed check (exit 2, no traceback)."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def wait_serving(daemon: AgentProcess) -> None:
    deadline = time.monotonic() + 30
    while "serving root" not in daemon.log():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)


def test_good_credentials_pass_and_the_session_keeps_its_queued_message(site: Site) -> None:
    site.broker.start()
    root, operator = site.fleet.root.id, site.fleet.operator_id
    creds = site.broker_dir.credentials_for("root")
    # The agent's persistent session, as a stopped daemon leaves it, with one message queued.
    agent = Client(creds, session_expiry=3600)
    assert agent.connect() == 0
    assert agent.subscribe([topics.inbox_filter(root)]) == [1]
    agent.close()
    sender = Client(site.broker_dir.credentials_for(site.fleet.operator_name))
    assert sender.connect() == 0
    assert sender.publish(topics.inbox(root, operator), b"queued while stopped") == 0
    sender.close()

    result = check_login(site.config)
    assert result.returncode == 0, result.stderr
    assert "OK (root, 0 role(s))" in result.stdout
    assert "login OK: root logged in to" in result.stdout
    assert f"subscription to {topics.inbox_filter(root)} granted" in result.stdout

    # The check took nothing from the session: the daemon's next connection gets it.
    agent = Client(creds, session_expiry=3600)
    assert agent.connect() == 0
    assert agent.session_present
    assert agent.wait_payload(b"queued while stopped")
    agent.close()


def test_refused_while_the_daemon_runs_on_a_locked_broker(site: Site) -> None:
    site.broker.start()
    site.daemon.start()
    wait_serving(site.daemon)
    line = one_error(check_login(site.config))
    assert "not logging in as root: its daemon is running" in line
    assert "locks client ids" in line
    time.sleep(1.0)  # a takeover would show in the daemon's log within this
    assert site.daemon.process is not None
    assert site.daemon.process.poll() is None
    assert "lost the connection" not in site.daemon.log()
    site.daemon.stop()
    assert check_login(site.config).returncode == 0  # the lock went with the daemon


@pytest.mark.parametrize("site", [False], indirect=True, ids=["unlocked"])
def test_unlocked_broker_checks_beside_the_running_daemon(site: Site) -> None:
    site.broker.start()
    site.daemon.start()
    wait_serving(site.daemon)
    result = check_login(site.config)
    assert result.returncode == 0, result.stderr
    assert "no session left behind" in result.stdout
    time.sleep(1.0)  # a takeover would show in the daemon's log within this
    assert site.daemon.process is not None
    assert site.daemon.process.poll() is None
    assert "lost the connection" not in site.daemon.log()


def test_wrong_password_is_one_line_and_exit_2(site: Site) -> None:
    site.broker.start()
    secret = site.config.parent / "root.credentials.toml"
    text = secret.read_text()
    secret.write_text(re.sub(r'(?m)^password = ".*"$', 'password = "wrong"', text))
    line = one_error(check_login(site.config))
    assert "login check: the broker at 127.0.0.1:" in line
    assert "refused the credentials" in line


def test_no_broker_is_one_line_and_exit_2(site: Site) -> None:
    line = one_error(check_login(site.config))
    assert "login check: cannot reach the broker at 127.0.0.1:" in line
    assert "connection refused" in line


def test_login_needs_check(site: Site) -> None:
    result = check_login(site.config, "--login")
    assert result.returncode == 2
    assert "--login goes with --check" in result.stderr


def test_unreadable_tls_files_are_one_line_and_exit_2(site: Site) -> None:
    text = site.config.read_text()
    site.config.write_text(text.replace("[broker]\n", '[broker]\nca_file = "missing-ca.crt"\n', 1))
    line = one_error(check_login(site.config))
    assert "login check: cannot load the TLS files" in line
    assert "missing-ca.crt" in line


def test_tls_login_passes_and_a_foreign_ca_is_one_line(tmp_path: Path) -> None:
    fleet = parse_fleet(
        f'[operator]\nid = "{uuid4()}"\n\n[[agents]]\nname = "root"\nid = "{uuid4()}"\n'
    )
    init_pki(tmp_path / "pki", fleet)
    broker_dir = render_broker_dir(
        fleet,
        tmp_path / "broker",
        port=free_port(),
        tls_port=free_port(),
        pki_dir=tmp_path / "pki",
        run_as_user=getpass.getuser(),
    )
    config = render_agent_config(
        fleet, "root", broker_dir.root, tmp_path / "etc" / "root.toml", tmp_path / "state"
    ).config
    assert "ca_file" in config.read_text()
    with LocalBroker(broker_dir.conf, port=broker_dir.port):
        result = check_login(config)
        assert result.returncode == 0, result.stderr
        assert "login OK" in result.stdout
        # The bundle trusts another CA: the broker's certificate does not verify.
        rogue = PkiLayout(tmp_path / "rogue")
        init_pki(rogue.root, fleet)
        (tmp_path / "etc" / "root.tls" / "ca.crt").write_bytes(rogue.ca_cert.read_bytes())
        line = one_error(check_login(config))
        assert "login check: TLS: the certificate of the broker at" in line
