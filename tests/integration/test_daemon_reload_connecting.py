"""A SIGHUP taken while the daemon is still connecting applies to the agent that connects.

The reload of that moment changes only the config of a next attempt; the attempt under way
built its agent from the old one. Seen as a flaky key rotation: a specialist still starting
when its bundle was re-rendered kept the retired key of its master and refused every
message of it (docs/security.md, key rotation).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from tests.kits.fleetproc import AgentProcess, fleet_text, run_fleet, wait_until
from vox_mqtt.broker.signkeys import load_keys
from vox_mqtt.cli import main
from vox_mqtt.fleet.bundles import render_agent_config

SHAPE: dict[str, str | None] = {"root": None, "coordinator": "root"}


def connecting_to(pid: int, port: int) -> bool:
    """Return whether the process holds an established TCP connection to the port."""
    with contextlib.suppress(psutil.Error):
        return any(
            conn.raddr and conn.raddr.port == port and conn.status == psutil.CONN_ESTABLISHED
            for conn in psutil.Process(pid).net_connections(kind="tcp")
        )
    return False


def test_keys_rotated_during_a_connect_attempt_are_used_once_connected(tmp_path: Path) -> None:
    text = 'signatures = "require"\n' + fleet_text(SHAPE)
    with run_fleet(tmp_path, text, start=False) as procs:
        port = procs.broker_dir.port
        coordinator = procs.agents["coordinator"]
        old = load_keys(procs.broker_dir.root).current[procs.fleet.agent("coordinator").id]
        # A frozen broker accepts the TCP connection (the kernel does) but answers no
        # CONNECT: the daemon's first attempt is under way, and stays so until SIGCONT.
        os.kill(procs.broker.pid, signal.SIGSTOP)
        try:
            coordinator.start()
            wait_until(lambda: connecting_to(coordinator.pid, port), 20, "a connect attempt")
            out = str(procs.broker_dir.root)
            rotate = ["pki", "keys", str(tmp_path / "fleet.toml"), "--out", out]
            assert main([*rotate, "--rotate", "coordinator"]) == 0
            for name in SHAPE:
                agent = procs.agents[name]
                render_agent_config(
                    procs.fleet, name, procs.broker_dir.root, agent.config, agent.state_dir,
                    keepalive=5,
                )  # fmt: skip
            coordinator.signal(signal.SIGHUP)
            wait_until(lambda: "SIGHUP" in coordinator.log(), 20, "the SIGHUP taken")
        finally:
            os.kill(procs.broker.pid, signal.SIGCONT)
        wait_until(lambda: "serving coordinator" in coordinator.log(), 30, "the coordinator")
        wait_until(
            lambda: "new signing keys, used at once" in coordinator.log(), 20, "the new keys"
        )
        procs.agents["root"].start()
        root = procs.agents["root"]
        # The root holds only the new key as current: it sees the coordinator's presence
        # as ACTIVE only if the coordinator signs with it.
        wait_until(lambda: "coordinator UNKNOWN -> ACTIVE" in root.log(), 30, "root sees it")
        time.sleep(1.5)  # a heartbeat more, signed after the reload too
        # Only a retained copy from before the rotation may be refused (its birth under the
        # new key replaces it), and that is no sign of forgery.
        assert "refused a message" not in root.log(), root.log()
        assert "FORGED_TRAFFIC" not in root.log(), root.log()
        new = load_keys(procs.broker_dir.root).current[procs.fleet.agent("coordinator").id]
        assert new.kid != old.kid


def test_a_sighup_while_the_daemon_starts_is_applied_not_fatal(tmp_path: Path) -> None:
    # SIGHUP's default action ends a process: a reload that came before the loop's handler
    # killed the daemon with an empty log (seen as a flaky key rotation test).
    with run_fleet(tmp_path, fleet_text(SHAPE), start=False) as procs:
        procs.agents["root"].start()
        plain = procs.agents["coordinator"]
        coordinator = AgentProcess(
            plain.name, plain.config, plain.state_dir, plain.log_path, module="tests.kits.earlyhup"
        )
        procs.agents["coordinator"] = coordinator
        coordinator.start()
        wait_until(lambda: "serving coordinator" in coordinator.log(), 30, "the coordinator")
        wait_until(lambda: "SIGHUP: logs reopened" in coordinator.log(), 10, "the reload")
        assert coordinator.process is not None
        assert coordinator.process.poll() is None
