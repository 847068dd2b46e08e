"""sd_notify over a real unix datagram socket, the watchdog variables and the log format."""

from __future__ import annotations

import io
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_daemon.logs import LogSetup, OneLineFormatter, under_journald
from agent_daemon.sdnotify import Notifier, watchdog_interval


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket bound to a path, as systemd's notify socket is."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield sock, str(path)
    sock.close()


def test_notify_sends_one_datagram_per_state_change(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("serving\nroot")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving root"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping("bye")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=bye"
    assert notifier.extend_timeout(1.5)
    assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=1500000"
    notifier.close()


def test_abstract_namespace_address() -> None:
    name = f"vox-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": f"@{name}"})
        assert notifier.status("hello")
        assert sock.recv(4096) == b"STATUS=hello"
        notifier.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready("x")
    # A vsock or relative address is not one this daemon speaks: ignored, not an error.
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled


def test_a_vanished_manager_is_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with caplog.at_level(logging.WARNING):
        assert not notifier.watchdog()
        assert not notifier.watchdog()
    assert len([r for r in caplog.records if "cannot notify" in r.message]) == 1
    notifier.close()


def test_watchdog_interval_applies_to_this_process_only() -> None:
    pid = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": pid}) == 1.0
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({}) is None


def _record(level: int, message: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("vox-agent", level, __file__, 1, message, (), exc_info)


def test_journald_format_has_priority_and_no_timestamp() -> None:
    formatter = OneLineFormatter(journald=True)
    assert formatter.format(_record(logging.WARNING, "broker lost")) == "<4>vox-agent: broker lost"
    assert formatter.format(_record(logging.ERROR, "bad")).startswith("<3>")
    assert formatter.format(_record(logging.DEBUG, "x")).startswith("<7>")


def test_every_event_is_one_line_even_with_a_traceback() -> None:
    try:
        raise RuntimeError("deep\nproblem")
    except RuntimeError as caught:
        exc = caught
    for journald in (True, False):
        text = OneLineFormatter(journald=journald).format(_record(logging.ERROR, "boom", exc))
        assert "\n" not in text
        assert "RuntimeError: deep | problem" in text
    plain = OneLineFormatter(journald=False).format(_record(logging.INFO, "hello"))
    assert plain[:4].isdigit()
    assert " INFO vox-agent: hello" in plain


def test_journal_stream_is_trusted_only_when_stderr_is_that_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "stream").open("w") as stream:
        stat = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        assert under_journald(stream)
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino + 1}")
        assert not under_journald(stream)
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not under_journald(io.StringIO())


def test_reopen_follows_a_rotated_log_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.log"
    setup = LogSetup(level="info", log_file=path)
    logger = logging.getLogger("vox-agent.test")
    try:
        logger.info("before rotation")
        path.rename(tmp_path / "agent.log.1")
        setup.reopen()
        logger.info("after rotation")
        logger.debug("not at info level")
    finally:
        setup.close()
    assert "before rotation" in (tmp_path / "agent.log.1").read_text()
    assert "after rotation" in path.read_text()
    assert "not at info level" not in path.read_text()
