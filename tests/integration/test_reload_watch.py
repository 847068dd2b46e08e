"""After a proven reload the broker is watched; a broker that crashes or cannot be reached
is one line and a non-zero exit (docs/broker.md, "Watching after a reload")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable

import pytest

from tests.kits.brokerkit import (
    SecureBroker,
    add_agent,
    reload_broker,
    rerender,
    seven_agent_fleet,
)
from vox_mqtt.cli import main

SecureFactory = Callable[..., SecureBroker]


class WhenThen:
    """Send a signal to the broker once a condition holds (checked every 10 ms, bounded)."""

    def __init__(self, when: Callable[[], bool], pid: int, sig: signal.Signals) -> None:
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(when, pid, sig), daemon=True)
        self._thread.start()

    def _run(self, when: Callable[[], bool], pid: int, sig: signal.Signals) -> None:
        deadline = time.monotonic() + 30
        while not self._stop.is_set() and time.monotonic() < deadline:
            if when():
                os.kill(pid, sig)
                self.done.set()
                return
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_broker_that_dies_after_the_proof_fails_the_reload(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    rerender(secure, add_agent(secure.fleet, "spec_a3", "coord_a"))
    kept = secure.dir.root / "last-good"
    shutil.rmtree(kept)
    pid = secure.broker.pid
    # last-good/ is written once the canary has proven the rules: the watch has begun.
    killer = WhenThen(lambda: (kept / "passwd").exists(), pid, signal.SIGKILL)
    try:
        started = time.monotonic()
        code = reload_broker(secure, "--watch", "20")
        took = time.monotonic() - started
    finally:
        killer.close()
    assert killer.done.is_set()
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"vox: error: RELOAD FAILED: the broker (pid {pid}) died ")
    assert "s after the reload: the canary had proven the new rules" in line
    assert took < 15  # noticed at once, not at the end of the window
    assert not secure.broker.running


def test_a_dynsec_broker_whose_port_stops_answering_fails_the_apply(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pid given: the watch sees the listener refuse connections."""
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    kept = secure.dir.root / "last-good" / "dynsec.json"
    kept.unlink(missing_ok=True)
    killer = WhenThen(kept.exists, secure.broker.pid, signal.SIGKILL)
    try:
        code = main(["broker", "reload", str(secure.dir.root), "--watch", "20"])
    finally:
        killer.close()
    assert killer.done.is_set()
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"vox: error: APPLY FAILED: 127.0.0.1:{secure.dir.port} refused connections "
    )
    assert "a restarted broker loads" in line


def test_a_dynsec_rollback_that_cannot_reach_the_broker_is_one_line(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The canary cannot prove the edit, and the broker stops before the rollback."""
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    assert main(["broker", "reload", str(secure.dir.root)]) == 0  # proven: kept in last-good/
    capsys.readouterr()
    path = secure.dir.root / "dynsec.json"
    document = json.loads(path.read_text())
    for role in document["roles"]:
        role["acls"] = [a for a in role["acls"] if not a["topic"].startswith("vox/canary/")]
    path.write_text(json.dumps(document))
    (secure.dir.root / "policy.json").unlink()  # an older render: only the canary proves
    canary = secure.dir.credentials_for("_canary").username
    log, seen = secure.broker.log_text, secure.broker.log_text().count(f"as {canary} ")
    # Stopped once the canary logs in: the edit is applied, the rollback comes after.
    stopper = WhenThen(
        lambda: log().count(f"as {canary} ") > seen, secure.broker.pid, signal.SIGSTOP
    )
    try:
        args = ["broker", "reload", str(secure.dir.root), "--accept-edit"]
        code = main([*args, "--verify-timeout", "1"])
    finally:
        stopper.close()
        os.kill(secure.broker.pid, signal.SIGCONT)
    assert stopper.done.is_set()
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("vox: error: APPLY FAILED: ")
    assert "the previous rules could not be re-applied (no subscription of `_admin`" in line
    assert line.endswith("fix it now")
