"""`systemctl reload mosquitto` runs `vox broker reload` inside the broker unit's bounds."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kits.brokerkit import add_agent, seven_agent_fleet
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.render import render_broker_dir

REPO = Path(__file__).resolve().parents[2]
DROP_IN = REPO / "systemd" / "mosquitto.service.d" / "vox.conf"


def unit_setting(name: str) -> list[str]:
    """Return the values of one setting of the broker's drop-in, in order."""
    return [
        line.split("=", 1)[1]
        for line in DROP_IN.read_text().splitlines()
        if line.startswith(f"{name}=")
    ]


def test_the_drop_in_restarts_a_crashed_broker_and_reloads_through_vox() -> None:
    assert unit_setting("Restart") == ["on-failure"]
    assert unit_setting("ExecReload")[-1].startswith("/usr/local/bin/vox broker reload ")
    # No "+" prefix: the reload runs with the unit's own bounds, as tested below.
    assert not unit_setting("ExecReload")[-1].startswith("+")


def bounding_set() -> str:
    """Return the drop-in's CapabilityBoundingSet as a setpriv --bounding-set argument."""
    [caps] = unit_setting("CapabilityBoundingSet")
    names = [c.lower().removeprefix("cap_") for c in caps.split()]
    return "-all," + ",".join(f"+{n}" for n in names)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the broker's own user can reach (pytest's are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="vox-unit-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the broker unit runs as root, then drops to a user")
def test_reload_works_within_the_units_capability_bounds(shared_dir: Path) -> None:
    """Before: Permission denied on the 0600 mosquitto-owned ACL, then on the signal."""
    try:
        broker_user = pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no mosquitto user on this machine")
    fleet = seven_agent_fleet()
    port = free_port()
    out = shared_dir / "broker"
    broker_dir = render_broker_dir(fleet, out, port=port, run_as_user="mosquitto")
    assert broker_dir.acl is not None
    st = broker_dir.acl.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, broker_user.pw_gid, 0o640)
    broker = LocalBroker(broker_dir.conf, port=port)
    broker.start()
    try:
        status = Path(f"/proc/{broker.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{broker_user.pw_uid}\b", status, re.M), "did not drop to user"
        render_broker_dir(add_agent(fleet, "spec_a3", "coord_a"), out, port=port)
        result = subprocess.run(
            [
                "setpriv",
                f"--bounding-set={bounding_set()}",
                "--no-new-privs",
                "--",
                sys.executable,
                "-m",
                "vox_mqtt.cli",
                "broker",
                "reload",
                str(out),
                "--pid",
                str(broker.pid),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "forbidden publish -> 0x87" in result.stdout
        assert broker.log_text().count("Reloading config") == 1
    finally:
        broker.stop()
