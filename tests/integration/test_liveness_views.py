"""What each identity sees of liveness, stale wills, and the war room, with real daemons.

Same fleet as test_liveness_faults.py: root -> coordinator -> spec_a, spec_b, each a
`vox-agent` process on the broker rendered from the fleet.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kits.brokerkit import Client
from tests.kits.faultkit import REPO, Deployment, Processes, deploy_fleet, run_vox, status_json
from tests.kits.livenesskit import ALL_COMMANDS, HEARTBEAT, KEEPALIVE, report, start_fleet
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.broker.passwd import Credentials

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def vox_background(*args: str | Path) -> Iterator[subprocess.Popen[str]]:
    """Start `vox ARGS...` without waiting for it; kill and reap it after, even on failure."""
    process = subprocess.Popen(
        [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


class Lines:
    """The lines a process prints, read as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._fd = process.stdout.fileno()
        self._buffer = b""
        self.seen: list[str] = []

    def next(self, deadline: float) -> str:
        """Return the next line; fail once the deadline (time.monotonic()) has passed."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._fd, 65536) if ready else b""
            if not chunk:
                raise AssertionError(f"no further line in time; so far: {self.seen}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.seen.append(line.decode())
        return self.seen[-1]


def logins(broker: LocalBroker) -> int:
    """Return how many logins the broker has logged so far."""
    return broker.log_text().count("New client connected")


def wait_for_login(broker: LocalBroker, before: int, timeout: float = 15) -> None:
    """Wait until the broker logged a login after `before` logins, and its retained messages."""
    deadline = time.monotonic() + timeout
    while logins(broker) <= before:
        assert time.monotonic() < deadline, "the vox command never logged in"
        time.sleep(0.05)
    time.sleep(1.0)  # the subscription's retained messages follow the login


def creds(dep: Deployment, name: str) -> Credentials:
    c = dep.broker_dir.credentials_for(name)
    return Credentials(username=c.username, password=c.password, host="127.0.0.1", port=dep.port)


def test_each_identity_sees_only_what_the_acl_lets_it_read_and_a_stale_will_flips_no_one(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], processes: Processes
) -> None:
    # Looks as agents and a second connection of spec_a need client ids left unlocked.
    dep = deploy_fleet(tmp_path, heartbeat=HEARTBEAT, keepalive=KEEPALIVE, lock_client_ids=False)
    # Slow heartbeats for spec_a: no heartbeat repairs its retained status during the check.
    dep.edit("spec_a", heartbeat_interval=30.0)
    broker = broker_factory(dep.conf_text(), port=dep.port)
    spec_a, coord = dep.id("spec_a"), dep.id("coordinator")
    with dep.recorder() as rec:
        start_fleet(dep, processes, rec)
        epochs = {n: rec.latest_status(dep.id(n))["epoch"] for n in ("root", "coordinator")}

        seen = {name: set(status_json(dep.configs[name])) for name in ("root", "spec_a")}
        seen["operator"] = set(status_json(dep.operator_config))
        assert seen["operator"] == {"root", "coordinator", "spec_a", "spec_b"}
        assert seen["root"] == {"root", "coordinator"}  # never a specialist
        assert seen["spec_a"] == {"coordinator", "spec_a"}  # never its sibling
        out = run_vox("status", "--config", dep.configs["root"])
        assert out.returncode == 0, out.stderr
        assert "as seen by root (agent)" in out.stdout
        assert "coordinator" in out.stdout
        assert "spec_" not in out.stdout
        # Those looks disturbed nobody: same epochs, no war-room post.
        assert {n: rec.latest_status(dep.id(n))["epoch"] for n in epochs} == epochs
        assert not [s for s in rec.seen if s.topic.startswith("vox/warroom/")]

        killed = time.monotonic()
        processes["spec_a"].signal(signal.SIGKILL)
        will = rec.status(spec_a, after=killed, status="INACTIVE", timeout=5)
        old_epoch = will.json()["details"]["epoch"]
        reborn = time.monotonic()
        processes["spec_a"].start()
        rec.status(spec_a, after=reborn, status="ACTIVE", min_epoch=old_epoch + 1, timeout=20)
        rec.wait_warroom(coord, spec_a, resolved=None, after=reborn)
        rec.status(coord, after=reborn, commands=ALL_COMMANDS)

        before = logins(broker)
        with vox_background("watch", "--config", dep.operator_config, "--duration", "5") as watch:
            wait_for_login(broker, before)
            # The will of the superseded session arrives late, retained, from spec_a itself.
            late = Client(creds(dep, "spec_a"), client_id=f"{spec_a}-late-will")
            assert late.connect() == 0
            injected = time.monotonic()
            assert will.topic == f"vox/{spec_a}/presence"  # where a will lands
            assert late.publish(will.topic, will.payload, retain=True) == 0
            late.close()
            output, errors = watch.communicate(timeout=30)
        assert watch.returncode == 0, errors
        rec.status(coord, after=injected + 2.0, commands=ALL_COMMANDS)

    # The coordinator kept spec_a ACTIVE: no alert and no change to its advertisement.
    assert rec.warroom(coord, spec_a, after=injected) == []
    # The operator's live view kept the newer epoch too.
    line = next(ln for ln in output.splitlines() if "spec_a" in ln)
    assert "spec_a ACTIVE" in line, output
    assert f"epoch {old_epoch}," not in line


def test_war_room_one_post_per_incident_seen_by_a_late_operator_and_followed(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], processes: Processes
) -> None:
    dep = deploy_fleet(tmp_path, heartbeat=HEARTBEAT, keepalive=KEEPALIVE)
    dep.edit("spec_b", disk_alert_percent=1.0)  # every real disk is fuller than that
    broker_factory(dep.conf_text(), port=dep.port)
    coord, spec_a, spec_b = (dep.id(n) for n in ("coordinator", "spec_a", "spec_b"))
    with dep.recorder() as rec:
        started = time.monotonic()
        start_fleet(dep, processes, rec)
        disk = rec.wait_warroom(spec_b, spec_b, after=started)
        details = disk.json()["details"]
        assert (details["error_code"], details["severity"]) == ("DISK_FULL", "ERROR")
        assert "disk_percent" in details["description"]
        report("daemon start with disk_alert_percent 1 -> DISK_FULL post", disk.at - started)

        killed = time.monotonic()
        processes["spec_a"].signal(signal.SIGKILL)
        rec.wait_warroom(coord, spec_a, after=killed, timeout=2)
        time.sleep(3 * HEARTBEAT)  # heartbeats go on; the incident is posted once

        # An operator who connects now still sees every open incident.
        out = run_vox("warroom", "--config", dep.operator_config, "--json")
        assert out.returncode == 0, out.stderr
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        assert sorted((r["source_name"], r["subject_name"], r["error_code"]) for r in rows) == [
            ("coordinator", "spec_a", "VM_CONNECTION_LOST"),
            ("spec_b", "spec_b", "DISK_FULL"),
        ]
        out = run_vox("warroom", "--config", dep.operator_config)
        assert out.returncode == 0, out.stderr
        assert "open incidents: 2" in out.stdout
        assert "DISK_FULL from spec_b about spec_b" in out.stdout

        with vox_background(
            "warroom", "--config", dep.operator_config, "--follow", "--json"
        ) as follow:
            lines = Lines(follow)
            # It lists the open incidents, then follows: every post after the list is printed.
            deadline = time.monotonic() + 30
            listed = [json.loads(lines.next(deadline)) for _ in range(2)]
            assert sorted(r["subject_name"] for r in listed) == ["spec_a", "spec_b"]
            processes["spec_b"].signal(signal.SIGKILL)  # a new incident while following
            reborn = time.monotonic()
            processes["spec_a"].start()  # and a recovery
            rec.wait_warroom(coord, spec_a, resolved=None, after=reborn, timeout=20)
            followed: list[tuple[str, str, bool]] = []
            deadline = time.monotonic() + 30
            wanted = {
                ("spec_b", "VM_CONNECTION_LOST", False),
                ("spec_a", "VM_CONNECTION_LOST", True),
            }
            while not wanted <= set(followed):
                r = json.loads(lines.next(deadline))
                followed.append((r["subject_name"], r["error_code"], r["resolved"]))
            follow.send_signal(signal.SIGINT)  # stops following, as at a terminal
            _, errors = follow.communicate(timeout=30)
        assert follow.returncode == 130, errors

        # Exactly one post per incident, and the recovery resolved and cleared spec_a's.
        about_a = rec.warroom(coord, spec_a, after=killed)
        kinds = ["clear" if not s.payload else s.json()["details"]["resolved"] for s in about_a]
        assert kinds == [False, True, "clear"], kinds
        assert len([s for s in rec.warroom(spec_b, spec_b) if s.payload]) == 1

        # spec_b comes back with sane thresholds: it resolves the post it made before.
        dep.edit("spec_b", disk_alert_percent=100.0)
        back = time.monotonic()
        processes["spec_b"].start()
        resolved = rec.wait_warroom(spec_b, spec_b, resolved=True, after=back, timeout=20)
        assert resolved.json()["details"]["error_code"] == "DISK_FULL"
        rec.wait_warroom(spec_b, spec_b, resolved=None, after=back)
        rec.wait_warroom(coord, spec_b, resolved=None, after=back)
    out = run_vox("warroom", "--config", dep.operator_config, "--json")
    assert (out.returncode, out.stdout) == (0, ""), out.stderr
