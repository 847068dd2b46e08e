"""`vox broker reload`: a changed ACL reaches connected clients; a broken one never gets there."""

from __future__ import annotations

import getpass
import os
import pwd
import re
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kits.brokerkit import (
    NOT_AUTHORIZED,
    Client,
    SecureBroker,
    add_agent,
    seven_agent_fleet,
)
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli import main
from vox_mqtt.protocol.hierarchy import Fleet

ALLOWED = {0x00, 0x10}
SecureFactory = Callable[..., SecureBroker]


def reload_with_acl(secure: SecureBroker, staged: Path, *extra: str) -> int:
    """Run `vox broker reload DIR --pid PID --acl STAGED` against the secure broker."""
    return main(
        [
            "broker",
            "reload",
            str(secure.dir.root),
            "--pid",
            str(secure.broker.pid),
            "--acl",
            str(staged),
            *extra,
        ]
    )


def reload(secure: SecureBroker, *extra: str) -> int:
    """Run `vox broker reload DIR --pid PID` against the secure broker."""
    return main(["broker", "reload", str(secure.dir.root), "--pid", str(secure.broker.pid), *extra])


def _publish_until(client: Client, topic: str, want_allowed: bool, timeout: float = 5.0) -> int:
    """Retry a publish until its outcome flips (SIGHUP is handled asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        code = client.publish(topic, b"probe")
        if (code in ALLOWED) == want_allowed or time.monotonic() > deadline:
            return code
        time.sleep(0.05)


def _rerender(secure: SecureBroker, fleet: Fleet) -> None:
    secure.fleet = fleet
    secure.dir = render_broker_dir(
        fleet,
        secure.dir.root,
        port=secure.dir.port,
        fmt=secure.dir.fmt,
        explorer=True,
        run_as_user=getpass.getuser(),
        lock_client_ids=secure.dir.conf.read_text().count("use_username_as_clientid") > 0,
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not mosquitto, to point --pid at."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(5)


def test_a_new_agent_reaches_connected_clients_after_reload(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = seven_agent_fleet()
    secure = secure_broker_factory(old, fmt="acl")
    coord_secret = secure.creds("coord_a").password
    coord = Client(secure.creds("coord_a"))
    try:
        assert coord.connect() == 0
        new = add_agent(old, "spec_a3", "coord_a")
        newcomer_id, coord_id = new.agent("spec_a3").id, new.agent("coord_a").id
        topic = f"vox/{newcomer_id}/inbox/{coord_id}"
        assert coord.publish(topic, b"too early") == NOT_AUTHORIZED

        _rerender(secure, new)
        assert secure.creds("coord_a").password == coord_secret  # secrets survive a re-render
        pid_file = tmp_path / "mosquitto.pid"
        pid_file.write_text(f"{secure.broker.pid}\n")
        assert main(["broker", "reload", str(secure.dir.root), "--pid-file", str(pid_file)]) == 0
        out = capsys.readouterr().out
        assert "sent SIGHUP" in out
        assert re.search(r"allowed publish -> 0x(00|10), forbidden publish -> 0x87", out)

        newcomer = Client(secure.creds("spec_a3"))
        try:
            assert newcomer.connect() == 0
            assert newcomer.subscribe([f"vox/{newcomer_id}/inbox/+"]) == [0x01]
            # The coordinator's session predates the reload and was never reconnected.
            assert _publish_until(coord, topic, want_allowed=True) in ALLOWED
            assert coord.publish(topic, b"welcome") in ALLOWED
            assert newcomer.wait_payload(b"welcome")
            assert coord.connected
        finally:
            newcomer.close()
    finally:
        coord.close()


def _corrupt(text: str) -> str:
    return text + "topic\tread\tvox/#\n"


def test_a_staged_acl_with_a_tab_is_refused_and_nothing_changes(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="acl")
    assert secure.dir.acl is not None
    before = secure.dir.acl.read_bytes()
    staged = tmp_path / "acl.new"
    staged.write_text(_corrupt(before.decode()))
    assert reload_with_acl(secure, staged) == 2
    assert "pass --accept-edit to install a hand edit" in capsys.readouterr().err
    code = reload_with_acl(secure, staged, "--accept-edit")
    err = capsys.readouterr().err
    assert code == 2
    line = before.decode().count("\n") + 1
    assert f"{staged}:{line}: " in err
    assert "a tab at column 6" in err
    assert "NO ACL" in err
    assert "Traceback" not in err
    assert secure.dir.acl.read_bytes() == before
    _still_enforced(secure)


def test_a_corrupted_live_acl_is_not_signalled(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="acl")
    assert secure.dir.acl is not None
    secure.dir.acl.write_text(_corrupt(secure.dir.acl.read_text()))
    assert reload(secure) == 2
    assert "not the acl `vox broker render` wrote" in capsys.readouterr().err
    assert reload(secure, "--accept-edit") == 2
    assert "refusing to reload" in capsys.readouterr().err
    _still_enforced(secure)


def _still_enforced(secure: SecureBroker) -> None:
    f = secure.fleet
    spec, coord = f.agent("spec_a1"), f.agent("coord_a")
    client = Client(secure.creds("spec_a1"))
    try:
        assert client.connect() == 0
        assert client.publish(f"vox/{f.root.id}/inbox/{spec.id}", b"x") == NOT_AUTHORIZED
        assert client.publish(f"vox/{coord.id}/inbox/{spec.id}", b"x") in ALLOWED
    finally:
        client.close()
    assert "Reloading config" not in secure.broker.log_text()


def test_the_trap_the_validator_exists_for(secure_broker_factory: SecureFactory) -> None:
    """Mosquitto 2.0.11 itself: SIGHUP with an unparsable acl_file switches ACLs off."""
    version = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout
    if "2.0.11" not in version:
        pytest.skip("documents the behaviour measured on Mosquitto 2.0.11")
    secure = secure_broker_factory(seven_agent_fleet(), fmt="acl")
    assert secure.dir.acl is not None
    f = secure.fleet
    spec = f.agent("spec_a1")
    secure.dir.acl.write_text(_corrupt(secure.dir.acl.read_text()))
    secure.broker.reload()  # what `kill -HUP` or `systemctl reload` would do unguarded
    client = Client(secure.creds("spec_a1"))
    try:
        assert client.connect() == 0
        topic = f"vox/{f.root.id}/inbox/{spec.id}"
        assert _publish_until(client, topic, want_allowed=True) in ALLOWED
    finally:
        client.close()
    assert "Invalid line in acl_file" in secure.broker.log_text()


def test_dynsec_reload_applies_live_without_a_signal(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    assert reload(secure) == 0
    assert "applied live through the dynamic-security plugin" in capsys.readouterr().out
    assert "Reloading config" not in secure.broker.log_text()


def test_only_mosquitto_gets_the_signal(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    render_broker_dir(seven_agent_fleet(), tmp_path / "b", run_as_user=getpass.getuser())
    assert main(["broker", "reload", str(tmp_path / "b"), "--pid", str(sleeper.pid)]) == 2
    assert "not mosquitto" in capsys.readouterr().err
    assert sleeper.poll() is None  # a SIGHUP would have ended `sleep`


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks need root")
def test_an_acl_the_broker_user_cannot_read_is_refused(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no mosquitto user on this machine")
    broker_dir = render_broker_dir(seven_agent_fleet(), tmp_path / "b", run_as_user="mosquitto")
    assert broker_dir.acl is not None
    assert broker_dir.acl.stat().st_gid == pwd.getpwnam("mosquitto").pw_gid
    os.chown(broker_dir.acl, 0, 0)
    assert main(["broker", "reload", str(broker_dir.root), "--pid", str(sleeper.pid)]) == 2
    assert "not readable by the broker's user `mosquitto`" in capsys.readouterr().err
    assert sleeper.poll() is None


def test_garbage_pid_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "pid"
    pid_file.write_text("not a pid")
    assert main(["broker", "reload", str(tmp_path), "--pid-file", str(pid_file)]) == 2
    assert "not a process id" in capsys.readouterr().err


def test_a_valid_staged_acl_is_installed_and_applied(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="acl")
    assert secure.dir.acl is not None
    spec = secure.creds("spec_a1")
    staged = tmp_path / "acl.new"
    staged.write_text(secure.dir.acl.read_text() + f"user {spec.username}\ntopic write lab/x\n")
    mode = stat.S_IMODE(secure.dir.acl.stat().st_mode)
    client = Client(spec)
    try:
        assert client.connect() == 0
        assert client.publish("lab/x", b"x") == NOT_AUTHORIZED
        assert reload_with_acl(secure, staged) == 2
        assert secure.dir.acl.read_text() != staged.read_text()
        code = reload_with_acl(secure, staged, "--accept-edit")
        assert code == 0
        captured = capsys.readouterr()
        assert f"installed {staged}" in captured.out
        assert "installed a hand edit of acl" in captured.err
        # Accepted once, it is what the manifest now vouches for.
        assert reload(secure) == 0
        assert secure.dir.acl.read_text() == staged.read_text()
        assert stat.S_IMODE(secure.dir.acl.stat().st_mode) == mode
        assert _publish_until(client, "lab/x", want_allowed=True) in ALLOWED
    finally:
        client.close()
