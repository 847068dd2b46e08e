"""Where the operator's console lives and who may use it (vox_mqtt/console/home/place.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from vox_mqtt.cli._home import one_shot_wanted
from vox_mqtt.console.home.place import (
    OperatorLock,
    connectable,
    idle_expired,
    peer_allowed,
    peer_uid,
)


def test_only_the_operators_own_user_is_let_in() -> None:
    assert peer_allowed(1000, 1000)
    assert not peer_allowed(1001, 1000)
    assert not peer_allowed(0, 1000)  # not even root: the socket is the operator's
    assert not peer_allowed(None, 1000)  # no credentials, no entry


def test_peer_uid_reads_the_other_ends_credentials() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_uid(left) == os.getuid()


def test_idle_counts_from_the_last_client_and_never_while_one_is_served() -> None:
    assert not idle_expired(None, 0, 0.0, 1e9)  # started by a person: runs until stopped
    assert not idle_expired(10.0, 1, 0.0, 100.0)  # a follower holds it, however long
    assert not idle_expired(10.0, 0, 95.0, 100.0)
    assert idle_expired(10.0, 0, 90.0, 100.0)


def test_a_long_socket_path_is_reached_through_its_folder(tmp_path: Path) -> None:
    short = tmp_path / "console.sock"
    if len(str(short)) <= 107:
        assert connectable(short) == str(short)
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    path = connectable(deep / "console.sock")
    assert path.startswith("/proc/self/fd/")
    assert path.endswith("/console.sock")
    assert len(path) <= 107


def test_the_lock_has_one_holder_at_a_time(tmp_path: Path) -> None:
    first, second = OperatorLock(tmp_path), OperatorLock(tmp_path)
    assert not first.held()
    assert first.acquire()
    assert first.holder() == os.getpid()
    assert second.held()
    assert not second.acquire()  # flock: a second open file is refused, same process too
    first.release()
    assert not second.held()
    assert second.acquire()
    second.release()


@pytest.mark.parametrize(
    ("flag", "env", "wanted"),
    [(False, "", False), (True, "", True), (False, "one-shot", True), (False, "other", False)],
)
def test_one_shot_by_flag_or_environment(
    flag: bool, env: str, wanted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOX_CONSOLE", env)
    assert one_shot_wanted(flag) is wanted
