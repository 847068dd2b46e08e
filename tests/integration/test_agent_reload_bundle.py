"""A running daemon reads its bundle whole on SIGHUP, and refuses it whole in one line.

A real `vox-agent` (the root of a two-agent fleet) on a real Mosquitto: its config is
rewritten with children that are no children (itself, its master, the war room), more
children than the documented bound, a FIFO in place of the file, and `/dev/zero` as its
password file. Each SIGHUP gives one `nothing changed` line, and the agent runs on as it
was: the next SIGHUP with the good file finds it "valid and unchanged", the retained status
(read by an independent mosquitto_sub) still shows it ACTIVE, and its memory did not grow.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from tests.kits.daemonkit import REPO, Daemon, Deployment, deploy
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.protocol.hierarchy import MAX_CHILDREN
from vox_mqtt.protocol.topics import WARROOM_ID


@pytest.fixture
def running(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], request: pytest.FixtureRequest
) -> Iterator[tuple[Deployment, Daemon]]:
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = str(REPO)
    daemon = Daemon(dep.root_config, tmp_path / "daemon.log", env)
    try:
        daemon.wait_log("connected")
        assert dep.retained_status(presence=True)["status"] == "ACTIVE"
        yield dep, daemon
    finally:
        daemon.kill()
        failed = getattr(request.node, "report_call", None)
        if failed is not None and failed.failed:
            print(f"\n--- daemon log ---\n{daemon.log()}")


def _sighup(daemon: Daemon, timeout: float = 10.0) -> str:
    """Send SIGHUP and return the one SIGHUP line the daemon logs for it."""
    before = daemon.log().count("SIGHUP:")
    daemon.signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while daemon.log().count("SIGHUP:") == before:
        assert daemon.process.poll() is None, "the daemon exited"
        assert time.monotonic() < deadline, f"no SIGHUP line within {timeout}s"
        time.sleep(0.05)
    lines = [line for line in daemon.log().splitlines() if "SIGHUP:" in line][before:]
    assert len(lines) == 1, lines
    return lines[0]


def _refused(line: str, why: str) -> None:
    assert why in line, line
    assert "nothing changed" in line, line


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _with_child(text: str, child: str, name: str) -> str:
    head = "[agent.children]"
    at = text.index("\n", text.index(head)) + 1
    return f'{text[:at]}"{child}" = "{name}"\n{text[at:]}'


def test_children_that_are_no_children_are_refused_whole(
    running: tuple[Deployment, Daemon],
) -> None:
    dep, daemon = running
    good = dep.root_config.read_text()
    cases = {
        dep.root_id: "is the agent itself",
        str(dep.fleet.operator_id): "is its master",
        str(WARROOM_ID): "is the war room's id",
    }
    for child, why in cases.items():
        # With a genuine new child beside it: nothing of the bundle is applied.
        text = _with_child(_with_child(good, child, "intruder"), str(uuid4()), "newcomer")
        dep.root_config.write_text(text)
        line = _sighup(daemon)
        _refused(line, why)
        assert "invalid config" in line, line
        assert "newcomer" not in daemon.log()
    many = "".join(f'"{uuid4()}" = "c{i}"\n' for i in range(MAX_CHILDREN + 1))
    dep.root_config.write_text(
        good.replace("[agent.children]  # id = name\n", "[agent.children]\n" + many)
    )
    line = _sighup(daemon)
    _refused(line, f"more than the {MAX_CHILDREN}")

    dep.root_config.write_text(good)
    assert "is valid and unchanged" in _sighup(daemon)
    assert dep.retained_status(presence=True)["status"] == "ACTIVE"
    assert "applied without reconnecting" not in daemon.log()
    assert "Traceback" not in daemon.log()


def test_a_fifo_config_and_a_device_password_file_are_refused_without_freezing(
    running: tuple[Deployment, Daemon],
) -> None:
    dep, daemon = running
    good = dep.root_config.read_text()
    # A FIFO nobody writes to: opening it for reading would block until a writer comes.
    dep.root_config.unlink()
    os.mkfifo(dep.root_config)
    line = _sighup(daemon)
    _refused(line, "a FIFO, not a regular file")
    dep.root_config.unlink()

    rss = _rss_kib(daemon.pid)
    dep.root_config.write_text(good.replace('"root.credentials.toml"', '"/dev/zero"'))
    line = _sighup(daemon)
    _refused(line, "/dev/zero: a device, not a regular file")
    assert _rss_kib(daemon.pid) < rss + 20 * 1024  # not a byte of /dev/zero was kept

    big = dep.root_config.parent / "big.toml"
    big.write_text(good + "# padding\n" * 200_000)  # 2 MB: over the 1 MiB a config may be
    dep.root_config.unlink()
    dep.root_config.symlink_to(big)
    line = _sighup(daemon)
    _refused(line, "more than the 1048576")
    dep.root_config.unlink()

    dep.root_config.write_text(good)
    assert "is valid and unchanged" in _sighup(daemon)
    # The loop kept serving: the broker still has its live status, and no stall was logged.
    assert dep.retained_status(presence=True)["status"] == "ACTIVE"
    assert "event loop" not in daemon.log()
    assert "Traceback" not in daemon.log()
