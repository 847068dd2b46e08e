"""The vox-agent daemon as a real process: sd_notify, watchdog, SIGTERM, SIGHUP, broker outages.

Each test renders a secured broker from a fleet (`render_broker_dir`), renders the root's
daemon config with `render_agent_config`, and runs `python -m agent_daemon` with a real
unix datagram socket as $NOTIFY_SOCKET. Independent witnesses: `mosquitto_sub` on the
retained status, the daemon's ledger, the operator console.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.kits.daemonkit import REPO, Daemon, NotifySocket, deploy
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import CommandFailed

pytestmark = pytest.mark.slow


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.fixture
def run_daemon(
    request: pytest.FixtureRequest, tmp_path: Path, notify: NotifySocket
) -> Iterator[Callable[..., Daemon]]:
    """Start daemons with NOTIFY_SOCKET (and WATCHDOG_USEC if asked); print logs on failure."""
    started: list[Daemon] = []

    def start(config: Path, *, watchdog_usec: int | None = None) -> Daemon:
        env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_PID", "JOURNAL_STREAM")}
        env.update(NOTIFY_SOCKET=str(notify.path), PYTHONPATH=str(REPO))
        env.pop("WATCHDOG_USEC", None)
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        daemon = Daemon(config, tmp_path / f"daemon-{len(started)}.log", env)
        notify.process = daemon.process
        started.append(daemon)
        return daemon

    yield start
    failed = getattr(request.node, "report_call", None)
    for daemon in started:
        daemon.kill()
        if failed is not None and failed.failed:
            print(f"\n--- daemon log ({daemon.log_path}) ---\n{daemon.log()}")


def _ledger_rows(state_dir: Path, action: str) -> int:
    path = state_dir / "logs.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        try:
            query = "SELECT count(*) FROM logs WHERE action = ?"
            (count,) = db.execute(query, (action,)).fetchone()
        except sqlite3.OperationalError:  # the schema is not there yet
            return 0
    return int(count)


def _poll(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _verify_ledger(state_dir: Path, *, min_rows: int = 1) -> None:
    async def verify() -> None:
        memory = VOXAgentMemory(state_dir / "logs.db", read_only=True)
        try:
            report = await memory.verify()
        finally:
            await memory.close()
        assert report.ok, report.problem
        assert report.rows >= min_rows

    asyncio.run(verify())


def test_ready_only_once_the_birth_is_on_the_broker(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    witness = subprocess.Popen(
        [*dep.sub_args(), "-C", "1"], stdout=subprocess.PIPE, text=True, stderr=subprocess.PIPE
    )
    time.sleep(0.5)  # let the witness subscribe; it prints the first status it sees
    daemon = run_daemon(dep.root_config)
    frozen = threading.Event()

    def freeze() -> None:
        # Freeze the daemon the instant READY=1 arrives: whatever is on the broker now
        # was put there before READY, since a stopped process cannot publish.
        os.kill(daemon.pid, signal.SIGSTOP)
        frozen.set()

    notify.on_ready = freeze
    try:
        notify.wait_for("READY=1")
        assert frozen.is_set()
        seen, _ = witness.communicate(timeout=10)
        first = json.loads(seen)["details"]
        retained = dep.retained_status()
        alive = dep.retained_status(presence=True)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        witness.kill()
        witness.wait(5)
    # The full status says no state (docs/liveness.md): the presence says ACTIVE.
    assert "status" not in first
    assert "status" not in retained
    assert alive["status"] == "ACTIVE"
    assert retained["epoch"] == first["epoch"] == alive["epoch"]
    assert sorted(retained["commands"]) == ["echo", "slow", "wedge"]
    # systemd's status line: the health first (connected, the ledger), then what it serves.
    status = next(line for line in notify.lines() if "; serving root" in line)
    assert status.startswith("STATUS=connected to 127.0.0.1:")
    assert ", ledger ok; serving root" in status
    assert f"epoch {retained['epoch']}" in status
    assert notify.lines().index("READY=1") > 0  # the connecting STATUS came first
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert "STOPPING=1" in notify.lines()
    # The stop may take the configured grace (10 s) plus the SHUTDOWN publish.
    assert notify.lines()[-1] == "EXTEND_TIMEOUT_USEC=25000000"
    assert "Traceback" not in daemon.log()


def test_watchdog_pings_while_healthy_and_none_while_the_loop_is_wedged(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    daemon = run_daemon(dep.root_config, watchdog_usec=1_000_000)
    ready = notify.wait_for("READY=1")
    healthy_until = notify.wait_for("WATCHDOG=1", count=7)
    pings = [t for t in notify.times_of("WATCHDOG=1") if ready <= t <= healthy_until]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # Half of WATCHDOG_USEC apart; systemd would kill the unit at a full second's silence.
    assert max(gaps) < 1.0, gaps

    async def wedge() -> None:
        async with OperatorConsole(dep.operator_config) as console:
            result = await console.send_command("wedge", {"seconds": 3}, wait=30)
        assert result.details["result"] == {"wedged": 3.0}

    asyncio.run(wedge())
    daemon.wait_log("event loop was blocked")
    after = notify.wait_for("WATCHDOG=1", count=len(notify.times_of("WATCHDOG=1")) + 2)
    pings = [t for t in notify.times_of("WATCHDOG=1") if t <= after]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # The wedge blocked the loop for 3 s: no ping in that window, then pings resumed.
    assert max(gaps) >= 3.0, gaps
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0


def test_watchdog_is_withheld_while_the_broker_session_is_down(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    broker = broker_factory(dep.conf_text, port=dep.port)
    daemon = run_daemon(dep.root_config, watchdog_usec=1_000_000)
    notify.wait_for("WATCHDOG=1", count=3)
    broker.kill()
    daemon.wait_log("no more watchdog pings")
    withheld_at = time.monotonic()
    time.sleep(2.0)  # a window twice the watchdog timeout
    assert not [t for t in notify.times_of("WATCHDOG=1") if t > withheld_at]
    assert any("lost; reconnecting" in line for line in notify.lines())
    broker.start()
    daemon.wait_log("broker session is back")
    count = len(notify.times_of("WATCHDOG=1"))
    notify.wait_for("WATCHDOG=1", count=count + 2)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert "Traceback" not in daemon.log()


def test_sigterm_while_the_broker_is_down_still_exits_cleanly(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path, grace=2.0)
    broker = broker_factory(dep.conf_text, port=dep.port)
    daemon = run_daemon(dep.root_config, watchdog_usec=1_000_000)
    notify.wait_for("READY=1")
    broker.kill()
    _poll(lambda: any("lost; reconnecting" in line for line in notify.lines()))
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert "stopped while the broker was unreachable" in daemon.log()
    assert "Traceback" not in daemon.log()
    _verify_ledger(dep.state_dir, min_rows=0)


def test_sigterm_lets_in_flight_commands_finish_or_answers_shutting_down(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path, grace=3.0)
    broker_factory(dep.conf_text, port=dep.port)
    daemon = run_daemon(dep.root_config)
    notify.wait_for("READY=1")

    async def scenario() -> list[Any]:
        async with OperatorConsole(dep.operator_config) as console:
            calls = [
                asyncio.ensure_future(console.send_command("slow", {"seconds": s}, wait=15))
                for s in (1.0, 1.5, 30.0)
            ]
            # The ledger says when all three handlers have started.
            await asyncio.to_thread(_poll, lambda: _ledger_rows(dep.state_dir, "started") >= 3)
            daemon.signal(signal.SIGTERM)
            await asyncio.to_thread(notify.wait_for, "STOPPING=1")
            late = asyncio.ensure_future(console.send_command("echo", {"text": "hi"}, wait=20))
            return await asyncio.gather(*calls, late, return_exceptions=True)

    short_a, short_b, long_one, late = asyncio.run(scenario())
    assert short_a.details["result"] == {"slept": 1.0}
    assert short_b.details["result"] == {"slept": 1.5}
    for outcome in (long_one, late):
        assert isinstance(outcome, CommandFailed), outcome
        assert outcome.code == "SHUTTING_DOWN", outcome
    assert daemon.wait() == 0
    status = dep.retained_status()
    assert status["status"] == "INACTIVE"
    assert status["error_code"] == "SHUTDOWN"
    _verify_ledger(dep.state_dir)
    log = daemon.log()
    assert "stopping on SIGTERM: 3 command(s) in flight, grace 3s" in log
    assert "Traceback" not in log


def test_unreachable_broker_is_retried_with_backoff_until_it_appears(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    # Each try gives up on the absent broker after 2 s (10 s by default).
    text = dep.root_config.read_text().replace("[broker]\n", "[broker]\nconnect_timeout = 2\n", 1)
    assert "connect_timeout = 2" in text, text
    dep.root_config.write_text(text)
    daemon = run_daemon(dep.root_config)
    daemon.wait_log("cannot connect to the broker (try 2)", timeout=60)
    assert "READY=1" not in notify.lines()
    assert any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in notify.lines())
    assert any("waiting for the broker" in line for line in notify.lines())
    broker_factory(dep.conf_text, port=dep.port)
    notify.wait_for("READY=1", timeout=90)
    assert dep.retained_status(presence=True)["status"] == "ACTIVE"
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    log = daemon.log()
    assert "connection refused" in log
    assert "Traceback" not in log
    # Backoff with jitter: the n-th wait is drawn from [0.5, 1] x 2^n seconds.
    waits = [
        float(line.rsplit("next try in ", 1)[1].rstrip("s"))
        for line in log.splitlines()
        if "next try in " in line
    ]
    assert len(waits) >= 2
    for n, wait in enumerate(waits):
        assert 0.5 * 2**n - 0.05 <= wait <= 2**n + 0.05, waits


@pytest.mark.parametrize("wrong", ["password", "username"])
def test_a_refused_login_stops_the_daemon_with_exit_77(
    tmp_path: Path,
    broker_factory: Callable[..., LocalBroker],
    notify: NotifySocket,
    run_daemon,
    wrong: str,
) -> None:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    if wrong == "password":
        secret = dep.root_config.parent / "root.credentials.toml"
        secret.write_text(re.sub(r'password = ".*"', 'password = "wrong"', secret.read_text()))
    else:  # an identity the broker does not know: "not authorized" or "bad username"
        text = dep.root_config.read_text()
        dep.root_config.write_text(
            re.sub(r'username = ".*"', f'username = "{uuid4()}"', text, count=1)
        )
    daemon = run_daemon(dep.root_config)
    # 77 is what the unit's RestartPreventExitStatus lists: systemd does not restart-loop.
    assert daemon.wait(timeout=60) == 77
    log = daemon.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert "the broker refused this agent" in errors[0]
    assert "not retrying (exit 77)" in errors[0]
    assert "(try 2)" not in log
    assert "Traceback" not in log
    assert "READY=1" not in notify.lines()
    assert any(line.startswith("STATUS=the broker refused this agent") for line in notify.lines())
    unit = (REPO / "systemd" / "vox-agent@.service").read_text()
    assert "RestartPreventExitStatus=2 77" in unit.splitlines()


def test_a_second_daemon_of_one_agent_stops_with_one_line_and_the_first_runs_on(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    first = run_daemon(dep.root_config)
    notify.wait_for("READY=1")
    second = run_daemon(dep.root_config)
    assert second.wait() == 2
    log = second.log()
    assert "another vox-agent is running with the state dir" in log
    assert "Traceback" not in log
    assert "connect" not in log.lower()  # it never reached for the broker
    # The first one kept its session: nothing took it over.
    assert first.process.poll() is None
    assert "lost the connection" not in first.log()
    assert dep.retained_status(presence=True)["status"] == "ACTIVE"
    first.signal(signal.SIGTERM)
    assert first.wait() == 0


def test_a_state_dir_that_is_a_file_is_one_clear_line(tmp_path: Path, run_daemon) -> None:
    dep = deploy(tmp_path)
    dep.state_dir.parent.mkdir(parents=True, exist_ok=True)
    dep.state_dir.write_text("not a folder\n")
    daemon = run_daemon(dep.root_config)
    assert daemon.wait(timeout=60) == 2
    log = daemon.log()
    assert f"state dir {dep.state_dir}: it is a file, not a folder" in log
    assert "File exists" not in log
    assert "Traceback" not in log


def test_sigterm_while_waiting_for_the_broker_exits_cleanly(
    tmp_path: Path, notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    daemon = run_daemon(dep.root_config)
    notify.wait_for(f"EXTEND_TIMEOUT_USEC={40 * 1_000_000}")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0
    assert "stopped (SIGTERM) before the broker was reached" in daemon.log()
    assert "READY=1" not in notify.lines()


def test_sighup_reopens_logs_and_rechecks_the_config(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], notify: NotifySocket, run_daemon
) -> None:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    daemon = run_daemon(dep.root_config)
    notify.wait_for("READY=1")
    # The names the agent knows are kept beside its ledger, for `vox ledger` views.
    names = json.loads((dep.state_dir / "names.json").read_text())
    assert names == {
        dep.root_id: "root",
        str(dep.fleet.agent("leaf").id): "leaf",
        str(dep.fleet.operator_id): dep.fleet.operator_name,
    }
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("is valid and unchanged")
    notify.wait_for("RELOADING=1")
    notify.wait_for("READY=1", count=2)
    text = dep.root_config.read_text()
    dep.root_config.write_text(text.replace("interval = 15.0", "interval = 5.0"))
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("agent.heartbeat_interval): restart the agent to apply it")
    dep.root_config.write_text("kind = 'agent'\n[agent\n")
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("still running with the config it started")
    assert daemon.process.poll() is None
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert "Traceback" not in daemon.log()
