"""F2: every documented way to reload a TLS broker goes through the safe reload.

The drop-in's own reload command line (read from systemd/mosquitto.service.d/vox.conf)
runs ten times against a real TLS Mosquitto while clients publish over TLS and persistent
sessions go offline and come back (the pattern that crashed 2.0.11 on SIGHUP,
docs/broker.md "SIGHUP and TLS"); `vox broker check` warns about a host that would still
signal it; the logrotate entry render writes rotates a log with logrotate itself, without
a signal (docs/security.md, F2).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.kits.brokerkit import Client as MqttClient
from tests.kits.tlskit import MOVERS, SHORT_EXPIRY, BrokerFactory, TlsFleet, come_and_go, wait_log
from vox_mqtt.broker.hupguard import LOGROTATE_NAME
from vox_mqtt.cli import main

REPO = Path(__file__).resolve().parents[2]
DROP_IN = REPO / "systemd" / "mosquitto.service.d" / "vox.conf"
ROUNDS = 10
RELOAD_WATCH = "0.25"  # s: $VOX_RELOAD_WATCH for the drop-in's reload
DEBIAN_UNIT = Path("/lib/systemd/system/mosquitto.service")
DEBIAN_LOGROTATE = Path("/etc/logrotate.d/mosquitto")


def drop_in_reload(broker_dir: Path, pid: int) -> list[str]:
    """The drop-in's ExecReload line, its vox run from this tree, for this broker and pid."""
    reloads = [
        line.split("=", 1)[1]
        for line in DROP_IN.read_text().splitlines()
        if line.startswith("ExecReload=")
    ]
    words = shlex.split(reloads[-1])  # the last one: the empty one before it clears Debian's
    assert words[0] == "/usr/local/bin/vox"
    mapped = {"/etc/vox/broker": str(broker_dir), "$MAINPID": str(pid)}
    return [sys.executable, "-m", "vox_mqtt.cli", *(mapped.get(w, w) for w in words[1:])]


class TlsTraffic:
    """A TLS client that publishes QoS 1 without pause, from a thread, until stopped."""

    def __init__(self, fleet: TlsFleet, name: str) -> None:
        agent = fleet.small.agent(name)
        self.topic = f"vox/{agent.master_id}/inbox/{agent.id}"
        self.client = MqttClient(fleet.tls(name), tls=True)
        assert self.client.connect() == 0
        self.acked = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.client.publish(self.topic, b"traffic") in (0x00, 0x10):
                self.acked += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.client.close()


@pytest.mark.slow
def test_the_drop_ins_reload_ten_times_under_tls_traffic_leaves_the_broker_up(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    fleet = TlsFleet(tmp_path)
    broker = fleet.start(broker_factory)
    traffic = TlsTraffic(fleet, "spec_a2")
    # The reload's own watch (20 s by default) for one step of it: a crash is caught after
    # it too, by this test's reconnects, its traffic and the broker's pid, round by round.
    env = {**os.environ, "PYTHONPATH": str(REPO), "VOX_RELOAD_WATCH": RELOAD_WATCH}
    try:
        for round_ in range(ROUNDS):
            for name in MOVERS:  # offline persistent sessions at the moment of the reload
                come_and_go(fleet, name, fleet.small, expiry=SHORT_EXPIRY)
            assert fleet.render("small" if round_ % 2 else "grown") == 0
            before = traffic.acked
            run = subprocess.run(
                drop_in_reload(fleet.root, broker.pid),
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert run.returncode == 0, f"round {round_}: {run.stderr}"
            assert "no signal" in run.stdout
            assert f"watched {RELOAD_WATCH} s: still up" in run.stdout, run.stdout
            for name in MOVERS:  # reconnects take the offline sessions over
                come_and_go(fleet, name, fleet.small, expiry=SHORT_EXPIRY)
            assert broker.running, f"round {round_}: the broker died\n{broker.log_tail()}"
            assert wait_traffic(traffic, before), f"round {round_}: no TLS publish went through"
        # The short sessions expire while the broker runs: where 2.0.11 crashed.
        assert wait_log(broker, lambda log: "Expiring client" in log, 15), broker.log_tail()
        before = traffic.acked
        assert wait_traffic(traffic, before)
    finally:
        traffic.close()
    assert broker.running, broker.log_tail()
    assert "Reloading config" not in broker.log_text()  # no SIGHUP was ever sent


def wait_traffic(traffic: TlsTraffic, before: int, timeout: float = 15.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if traffic.acked > before:
            return True
        done.wait(0.05)
    return False


def fake_host(root: Path, *, drop_in_for: Path | None, logrotate: str | None) -> Path:
    """A file tree with the distribution's mosquitto unit (and the drop-in if asked)."""
    units = root / "lib/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    if DEBIAN_UNIT.exists():
        shutil.copyfile(DEBIAN_UNIT, units / "mosquitto.service")
    else:  # the same reload line as Debian 12's mosquitto 2.0.11
        (units / "mosquitto.service").write_text("[Service]\nExecReload=/bin/kill -HUP $MAINPID\n")
    drop_ins = root / "etc/systemd/system/mosquitto.service.d"
    shutil.rmtree(drop_ins, ignore_errors=True)
    if drop_in_for is not None:
        drop_ins.mkdir(parents=True)
        text = DROP_IN.read_text().replace("/etc/vox/broker ", f"{drop_in_for} ")
        (drop_ins / "vox.conf").write_text(text)
    rotate = root / "etc/logrotate.d/mosquitto"
    rotate.parent.mkdir(parents=True, exist_ok=True)
    rotate.unlink(missing_ok=True)
    if logrotate is not None:
        rotate.write_text(logrotate)
    return root


def test_broker_check_warns_about_a_tls_broker_host_without_the_drop_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TlsFleet(tmp_path)
    debian_rotate = DEBIAN_LOGROTATE.read_text() if DEBIAN_LOGROTATE.exists() else None
    host = fake_host(tmp_path / "host", drop_in_for=None, logrotate=debian_rotate)
    capsys.readouterr()
    assert main(["broker", "check", str(fleet.root), "--root", str(host)]) == 1
    out = capsys.readouterr()
    warnings = out.err.splitlines()
    assert warnings[0].startswith("vox: warning: `systemctl reload mosquitto` would SIGHUP")
    assert "kill -HUP $MAINPID sends SIGHUP" in warnings[0]
    assert "systemd/mosquitto.service.d/vox.conf" in warnings[0]
    if debian_rotate is not None:  # Debian's postrotate runs `reload`: the same SIGHUP
        assert "runs `reload` after a rotation" in warnings[1]
        assert str(fleet.root / LOGROTATE_NAME) in warnings[1]

    fake_host(host, drop_in_for=fleet.root, logrotate=debian_rotate)
    assert main(["broker", "check", str(fleet.root), "--root", str(host)]) == 0
    assert "nothing on this host sends the broker a SIGHUP" in capsys.readouterr().out

    rendered = (fleet.root / LOGROTATE_NAME).read_text()
    fake_host(host, drop_in_for=None, logrotate=rendered)
    assert main(["broker", "check", str(fleet.root), "--root", str(host)]) == 1
    [line] = capsys.readouterr().err.splitlines()  # the unit's kill only, not the rotation
    assert "ExecReload=/bin/kill" in line


def test_a_plain_broker_needs_no_drop_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TlsFleet(tmp_path)
    out = ["--out", str(fleet.root), "--no-pki"]
    assert main(["broker", "render", str(fleet.files["grown"]), *out]) == 0
    assert not (fleet.root / LOGROTATE_NAME).exists()  # no TLS: nothing to rotate apart
    host = fake_host(tmp_path / "host", drop_in_for=None, logrotate=None)
    assert main(["broker", "check", str(fleet.root), "--root", str(host)]) == 0
    assert main(["broker", "check", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("render the broker directory first")


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="no logrotate on this machine")
def test_the_rendered_logrotate_entry_rotates_without_a_signal(tmp_path: Path) -> None:
    fleet = TlsFleet(tmp_path)
    log = tmp_path / "mosquitto.log"
    log.write_text("a line the broker wrote\n" * 10_000)
    text = (fleet.root / LOGROTATE_NAME).read_text()
    assert "\tcopytruncate\n" in text
    conf = tmp_path / "rotate.conf"
    conf.write_text(text.replace("/var/log/mosquitto/mosquitto.log", str(log)))
    run = subprocess.run(
        ["logrotate", "-f", "-v", "-s", str(tmp_path / "state"), str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "running postrotate script" not in run.stderr  # nothing to signal anyone
    assert log.stat().st_size == 0  # emptied in place: the broker's open file stays valid
    assert (tmp_path / "mosquitto.log.1.gz").exists() or (tmp_path / "mosquitto.log.1").exists()
