"""A reload that can never open the firewall: exact bytes, digests, a canary, a way back."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.brokerkit import (
    NOT_AUTHORIZED,
    Client,
    SecureBroker,
    add_agent,
    reload_broker,
    rerender,
    seven_agent_fleet,
)
from vox_mqtt.broker.probe import probe_rules
from vox_mqtt.broker.text import MAX_LINE_BYTES, broker_file_text
from vox_mqtt.protocol.errors import ConfigError

ALLOWED = {0x00, 0x10}
SecureFactory = Callable[..., SecureBroker]


def edit_a_topic_line(acl: Path, suffix: bytes) -> None:
    """Append bytes to the first `topic readwrite` line of the installed ACL (a hand edit)."""
    lines = acl.read_bytes().split(b"\n")
    index = next(i for i, line in enumerate(lines) if line.startswith(b"topic readwrite"))
    lines[index] += suffix
    acl.write_bytes(b"\n".join(lines))


def assert_firewall_closed(secure: SecureBroker) -> None:
    """A specialist still cannot write into its sibling's or the root's inbox, nor read them."""
    f = secure.fleet
    spec, sibling, coord, root = f.agent("spec_a1"), f.agent("spec_a2"), f.agent("coord_a"), f.root
    client = Client(secure.creds("spec_a1"))
    try:
        assert client.connect() == 0
        forbidden = [
            f"vox/{sibling.id}/inbox/{spec.id}",
            f"vox/{root.id}/inbox/{spec.id}",
            f"vox/{root.id}/status",
        ]
        assert client.publish_many([(t, b"x") for t in forbidden]) == [NOT_AUTHORIZED] * 3
        assert client.publish(f"vox/{coord.id}/inbox/{spec.id}", b"x") in ALLOWED
    finally:
        client.close()


def test_a_carriage_return_in_the_acl_never_reaches_the_broker(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """F1: `\\r# reviewed` split the line for the validator only; Mosquitto ran with no ACL."""
    secure = secure_broker_factory(seven_agent_fleet())
    assert secure.dir.acl is not None
    edit_a_topic_line(secure.dir.acl, b"\r# reviewed")
    assert reload_broker(secure) == 2
    assert "not the acl `vox broker render` wrote" in capsys.readouterr().err
    assert reload_broker(secure, "--accept-edit") == 2
    err = capsys.readouterr().err
    assert "a carriage return at column" in err
    assert "Mosquitto would run with NO ACL" in err
    assert "Reloading config" not in secure.broker.log_text()
    assert_firewall_closed(secure)


def test_a_nul_byte_in_the_acl_never_reaches_the_broker(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """F7: after a NUL Mosquitto's line reader lost the rest of the file: every agent refused."""
    secure = secure_broker_factory(seven_agent_fleet())
    assert secure.dir.acl is not None
    edit_a_topic_line(secure.dir.acl, b"\0")
    assert reload_broker(secure, "--accept-edit") == 2
    assert "a NUL byte at column" in capsys.readouterr().err
    assert "Reloading config" not in secure.broker.log_text()
    assert_firewall_closed(secure)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"user a\ntopic read vox/a\r\n", "a carriage return at column 17"),
        (b"user a\ntopic read vox/a\0\n", "a NUL byte at column 17"),
        (b"user a\ntopic\tread vox/a\n", "a tab at column 6"),
        (b"user a\ntopic read vox/\xff\n", "not UTF-8 at column 16"),
        (b"user a\ntopic read vox/\x1b\n", "control byte 0x1b at column 16"),
        (b"\xef\xbb\xbfuser a\n", "byte order mark"),
        (b"user a\ntopic read vox/" + b"a" * MAX_LINE_BYTES + b"\n", "bytes long"),
    ],
)
def test_the_validator_refuses_what_mosquitto_would_read_differently(
    data: bytes, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        broker_file_text(data, source="acl")
    assert message in caught.value.problems[0]
    assert caught.value.problems[0].startswith("acl:")


def test_the_validator_passes_plain_utf8_lines() -> None:
    text = "user a\n# ünïcode comment\ntopic read vox/a\n"
    assert broker_file_text(text.encode(), source="acl") == text


def test_a_reload_the_canary_cannot_prove_is_undone_and_fails_loudly(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new rules never reach the broker (here: the signal went to another broker)."""
    secure = secure_broker_factory(seven_agent_fleet())
    other = secure_broker_factory(seven_agent_fleet())
    assert secure.dir.acl is not None
    assert secure.dir.passwd is not None
    before = (secure.dir.acl.read_bytes(), secure.dir.passwd.read_bytes())
    rerender(secure, add_agent(secure.fleet, "spec_a3", "coord_a"))
    assert secure.dir.acl.read_bytes() != before[0]
    code = reload_broker(secure, "--verify-timeout", "1", pid=other.broker.pid)
    err = capsys.readouterr().err
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("vox: error: RELOAD FAILED: ")
    assert "the rendered rules are not in force" in lines[0]
    assert "restored the previous acl and passwd" in lines[0]
    assert lines[0].endswith("the previous rules are in force")
    assert (secure.dir.acl.read_bytes(), secure.dir.passwd.read_bytes()) == before
    assert_firewall_closed(secure)


@pytest.mark.slow
def test_a_broker_that_stops_answering_fails_the_reload(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    rerender(secure, add_agent(secure.fleet, "spec_a3", "coord_a"))
    os.kill(secure.broker.pid, signal.SIGSTOP)
    try:
        code = reload_broker(secure, "--verify-timeout", "0.5")
    finally:
        os.kill(secure.broker.pid, signal.SIGCONT)
    assert code == 1
    # The rollback cannot reach the broker either: one line says both.
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("vox: error: RELOAD FAILED: no answer from 127.0.0.1:")
    assert "AND THE RESTORE FAILED TOO: no answer from 127.0.0.1:" in line
    assert_firewall_closed(secure)


def test_the_canary_notices_a_dead_broker(
    secure_broker_factory: SecureFactory,
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = probe_rules(
        secure.dir.credentials_for("_canary"),
        allowed="vox/canary/x",
        forbidden="vox/canary/forbidden",
        pid=gone.pid,
        timeout=1,
    )
    assert not result.ok
    assert result.reason == f"the broker (pid {gone.pid}) died"


def test_a_reload_of_an_unchanged_directory_is_proven_and_keeps_last_good(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    assert reload_broker(secure) == 0
    assert "forbidden publish -> 0x87" in capsys.readouterr().out
    kept = secure.dir.root / "last-good"
    assert secure.dir.acl is not None
    assert (kept / "acl").read_bytes() == secure.dir.acl.read_bytes()
    assert oct((kept / "acl").stat().st_mode & 0o777) == "0o600"
