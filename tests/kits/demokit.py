"""`vox demo` as a real process: run to its end or held open, and nothing of it left behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def demo_command(directory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vox_mqtt.cli", "demo", "--dir", str(directory), *extra]


def demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_demo(directory: Path, *extra: str, timeout: float) -> str:
    """Run the demo to its end, assert it succeeded, and return its output."""
    done = subprocess.run(
        demo_command(directory, *extra),
        cwd=REPO,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


@contextlib.contextmanager
def demo_process(directory: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """Run the demo with its output piped; stop it if the test leaves it running."""
    process = subprocess.Popen(
        demo_command(directory, *extra),
        cwd=REPO,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            # SIGTERM stops the demo with its broker and daemons (test_demo.py checks it);
            # a SIGKILL would leave those running.
            process.terminate()
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        process.communicate()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started_pids(directory: Path) -> list[int]:
    run = json.loads((directory / "run.json").read_text())
    return [pid for group in run["pids"].values() for pid in group]


def assert_nothing_left(directory: Path) -> None:
    pids = started_pids(directory)
    assert pids
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []
