"""`vox-agent --config FILE --health` against a running daemon whose disk fills up and frees.

The daemon's state dir is a real 8 MiB filesystem (tmpfs) filled to 100 %: its ledger
cannot record, `--health` says so and exits 1; once the space is back it exits 0 again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kits.diskkit import NEEDS_MOUNT, fill, small_tmpfs
from tests.kits.faultkit import ANALYST, Deployment, Processes, deploy_fleet
from tests.kits.fleetproc import REPO, child_env
from vox_mqtt.broker.local import LocalBroker

pytestmark = [pytest.mark.slow, NEEDS_MOUNT]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A root and a leaf whose state dir is a mounted 8 MiB tmpfs, removed after the test."""
    dep = deploy_fleet(tmp_path, {"root": (None, ()), "leaf": ("root", (ANALYST,))}, heartbeat=0.5)
    with small_tmpfs(dep.state_dir("leaf")):
        yield dep


def _health(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_daemon", "--config", str(config), "--health"],
        capture_output=True,
        text=True,
        timeout=30,
        env=child_env(),
        cwd=REPO,
        check=False,
    )


def _until(config: Path, code: int, timeout: float = 30.0) -> tuple[str, float]:
    """Poll --health until it exits with code; return what it printed and how long it took."""
    started = time.monotonic()
    while True:
        out = _health(config)
        if out.returncode == code:
            return out.stdout.strip(), time.monotonic() - started
        assert time.monotonic() - started < timeout, (out.returncode, out.stdout, out.stderr)


def test_health_exits_1_while_the_ledger_cannot_record_and_0_after(
    deployment: Deployment, broker_factory: Callable[..., LocalBroker], processes: Processes
) -> None:
    dep = deployment
    config = dep.configs["leaf"]
    never, _ = _until(config, 1, timeout=5)
    assert "not running" in never
    broker_factory(dep.conf_text(), port=dep.port)
    processes.start(dep)
    up, _ = _until(config, 0)
    assert up.startswith("leaf: connected to 127.0.0.1:")
    assert "ledger ok" in up

    filler = fill(dep.state_dir("leaf"))
    down, took = _until(config, 1)
    print(f"\nFIGURE --health exits 1 {took:.1f}s after the disk filled")
    assert "degraded" in down
    assert "ledger unavailable" in down
    assert "disk is full" in down or "full" in down

    filler.unlink()
    back, took = _until(config, 0)
    print(f"FIGURE --health exits 0 {took:.1f}s after the space came back")
    assert "ledger ok" in back

    processes["leaf"].signal(signal.SIGTERM)
    gone, _ = _until(config, 1)
    assert "not running" in gone or "stopp" in gone
