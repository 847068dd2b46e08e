"""Ctrl-C during `vox send --follow` at a terminal asks whether to cancel (docs/operations.md).

The question is asked on a real pseudo-terminal: its answer "y" cancels the request down the
tree, an empty answer leaves it running and says how to find it again; the request's answer
ends the question unanswered, and a second Ctrl-C ends the command at once.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, wait_until
from tests.kits.lifecyclekit import event_at, lifecycle_fleet, route_up
from vox_mqtt.console.operator import OperatorConsole

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("request-tty")) as found:
        yield found


def read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    """Read the terminal's output until marker shows (or fail after timeout)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} on the terminal; it showed {seen!r}"
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the other side closed
                break
    return seen


def drain(fd: int, quiet: float = 0.5) -> bytes:
    """Read what the terminal still shows, until it stays quiet for a moment."""
    seen = b""
    while select.select([fd], [], [], quiet)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        seen += chunk
    return seen


class AtATerminal:
    """`vox send ... --follow` with a pseudo-terminal as stdin and stderr, stdout a pipe."""

    def __init__(self, procs: FleetProcesses, *args: str) -> None:
        self.master, self.slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vox_mqtt.cli", "send", "--config",
             str(procs.operator_config), *args, "--follow", "--timeout", "600"],
            stdin=self.slave, stdout=subprocess.PIPE, stderr=self.slave, text=False,
            env=child_env(), cwd=REPO, start_new_session=True,
        )  # fmt: skip
        self.out = b""

    def read_out_until(self, marker: bytes, timeout: float) -> None:
        """Read the command's stdout until marker shows (or fail after timeout)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while marker not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} on stdout; it printed {self.out!r}"
            if select.select([fd], [], [], min(left, 0.5))[0]:
                chunk = os.read(fd, 4096)
                assert chunk, f"stdout closed before {marker!r}: {self.out!r}"
                self.out += chunk

    def ended_within(self, timeout: float) -> tuple[int, str, str]:
        """Wait for the command to end (fail after timeout); return code, stdout, terminal."""
        try:
            rest, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout}s later") from None
        return self.process.returncode, (self.out + rest).decode(), self.shown()

    def shown(self) -> str:
        return drain(self.master).decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)
        os.close(self.slave)


def follow_at_a_terminal(
    procs: FleetProcesses, events_file: Path, n: int, answer: bytes
) -> tuple[int, str, str]:
    """Run `vox send stuck --follow` with a terminal as stdin; Ctrl-C once the handler runs,
    answer the question, and return the exit code, the output and the terminal's text."""
    master, slave = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "vox_mqtt.cli", "send", "--config",
             str(procs.operator_config), "stuck", f"n={n}", "--follow", "--timeout", "600"],
            stdin=slave, stdout=subprocess.PIPE, stderr=slave, text=False,
            env=child_env(), cwd=REPO, start_new_session=True,
        )  # fmt: skip
        try:
            wait_until(lambda: event_at(events_file, "started", n), 30, "the handler to start")
            process.send_signal(signal.SIGINT)  # Ctrl-C
            asked = read_until(master, b"[y/N]", 20)
            os.write(master, answer + b"\n")
            out, _ = process.communicate(timeout=30)
            shown = asked + drain(master)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    finally:
        os.close(master)
        os.close(slave)
    return process.returncode, out.decode(), shown.decode(errors="replace")


def test_ctrl_c_at_a_terminal_asks_and_y_cancels(fleet: Fleet) -> None:
    procs, events_file = fleet
    asyncio.run(route_up(procs, "stuck"))
    code, out, shown = follow_at_a_terminal(procs, events_file, 21, b"y")
    request_id = out.splitlines()[0].removeprefix("request ")
    assert f"cancel request {request_id}? [y/N]" in shown, shown
    assert code == 1, (out, shown)
    assert "cancel: canceled" in out, out
    wait_until(lambda: event_at(events_file, "cancelled", 21), 10, "the handler's cancel")


def test_ctrl_c_at_a_terminal_and_no_answer_leaves_it_running(fleet: Fleet) -> None:
    procs, events_file = fleet
    # The route first, as every test here: under pytest-xdist this test may be the first of
    # the module on its worker, with a fleet of its own whose root knows no command yet.
    asyncio.run(route_up(procs, "stuck"))
    code, out, shown = follow_at_a_terminal(procs, events_file, 22, b"")
    request_id = out.splitlines()[0].removeprefix("request ")
    assert code == 130, (out, shown)
    assert f"request {request_id} left running" in shown, shown
    time.sleep(1.0)
    assert event_at(events_file, "cancelled", 22) is None
    # Left running, it is still the operator's to cancel (and the fleet then stops at once).
    report = asyncio.run(cancel(procs, UUID(request_id)))
    assert report["state"] == "canceled", report
    wait_until(lambda: event_at(events_file, "cancelled", 22), 10, "the handler's cancel")


async def cancel(procs: FleetProcesses, request_id: UUID) -> dict[str, Any]:
    async with OperatorConsole(procs.operator_config) as console:
        return await console.cancel(request_id, reason="the test is over", wait=20)


def test_the_answer_ends_the_question(fleet: Fleet) -> None:
    procs, _ = fleet
    asyncio.run(route_up(procs, "stuck"))
    term = AtATerminal(procs, "steps", "count=4", "pause=0.8")
    try:
        term.read_out_until(b" progress ", 30)
        term.process.send_signal(signal.SIGINT)  # Ctrl-C, and nobody answers the question
        asked = read_until(term.master, b"[y/N]", 20)
        code, out, shown = term.ended_within(20)  # the answer comes within about 3 s
    finally:
        term.close()
    assert b"cancel request " in asked, asked
    assert code == 0, (out, shown)
    assert "steps: 4" in out, out
    assert "left running" not in shown, shown


def test_a_second_ctrl_c_ends_the_command_at_once(fleet: Fleet) -> None:
    procs, events_file = fleet
    asyncio.run(route_up(procs, "stuck"))
    term = AtATerminal(procs, "stuck", "n=23")
    try:
        wait_until(lambda: event_at(events_file, "started", 23), 30, "the handler to start")
        term.process.send_signal(signal.SIGINT)
        read_until(term.master, b"[y/N]", 20)
        term.process.send_signal(signal.SIGINT)  # the second, while the question waits
        code, out, shown = term.ended_within(5)
    finally:
        term.close()
    request_id = out.splitlines()[0].removeprefix("request ")
    assert code == 130, (out, shown)
    line = f"vox: error: interrupted again: request {request_id} left running: "
    assert line in shown, shown
    assert "Traceback" not in shown, shown
    assert event_at(events_file, "cancelled", 23) is None
    report = asyncio.run(cancel(procs, UUID(request_id)))
    assert report["state"] == "canceled", report
