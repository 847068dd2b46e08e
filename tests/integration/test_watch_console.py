"""`vox watch` through the operator's console (docs/operations.md, "Watch the fleet").

operator -> root -> coordinator -> specialist as daemons (tests/kits/lifecyclekit.py) and
one `vox console serve`. `vox watch | cat` with the operator's config draws the console's
live view: it prints the fleet, then a line when the specialist is killed, then the banner
and every agent unknown while the broker is frozen, and the fleet again once it is back;
and the broker never sees a login of the watch's own (a look's `<id>-status-…` client id).
The console's frame for a terminal is the tree, laid out for the width asked.

These verbs run without the suite's VOX_CONSOLE=one-shot (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, serving_vox
from tests.kits.lifecyclekit import lifecycle_fleet, route_up
from vox_mqtt.cli._ask import ask_running

pytestmark = pytest.mark.slow

ROW = re.compile(r"^\d\d:\d\d:\d\d ")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[FleetProcesses]:
    with lifecycle_fleet(tmp_path / "fleet") as (procs, _):
        yield procs


def client_env() -> dict[str, str]:
    env = child_env()
    env.pop("VOX_CONSOLE", None)
    return env


class Lines:
    """A process's stdout lines, read as they come by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        stream = process.stdout
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line.rstrip("\n"))

    def join(self) -> None:
        self._thread.join(10)

    def wait_for(self, pattern: str, start: int = 0, timeout: float = 30.0) -> int:
        """Return the index of the first line from `start` matching pattern; fail after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in range(start, len(self.lines)):
                if re.search(pattern, self.lines[index]):
                    return index
            time.sleep(0.05)
        text = "\n".join(self.lines)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{text}")


@contextlib.contextmanager
def console_serving(config: Path, tmp_path: Path) -> Iterator[None]:
    """Run `vox console serve` for the operator until the block ends."""

    def ready(log: str) -> str | None:
        return "ready" if "listening on" in log else None

    serve = ["console", "serve", "--config", str(config)]
    with serving_vox(serve, tmp_path / "console.log", ready, "vox console serve"):
        yield


def piped(*args: str) -> subprocess.Popen[str]:
    """Start a verb through the console, its output into a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "vox_mqtt.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=client_env(), cwd=REPO,
    )  # fmt: skip


def interrupted(process: subprocess.Popen[str], seen: Lines) -> tuple[int, str]:
    """Ctrl-C the verb; return its exit code and what it said on stderr, pipes closed."""
    process.send_signal(signal.SIGINT)
    code = process.wait(30)
    seen.join()
    assert process.stderr is not None
    assert process.stdout is not None
    err = process.stderr.read()
    process.stderr.close()
    process.stdout.close()
    return code, err


def test_watch_into_a_pipe_draws_the_consoles_live_view(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    config = fleet.operator_config
    operator = fleet.fleet.operator_id
    asyncio.run(route_up(fleet, "echo"))

    with console_serving(config, tmp_path):
        mark = len(fleet.broker.log_text())
        watch = piped("watch", "--config", str(config), "--duration", "120")
        try:
            seen = Lines(watch)
            head = seen.wait_for(r"vox watch: 3 agent\(s\) as seen by operator \(operator\)")
            for name in ("root", "coordinator", "specialist"):
                seen.wait_for(rf"^{ROW.pattern[1:]}\s*{name} ACTIVE", head)
            # A change: one line, for the agent that changed.
            fleet.agents["specialist"].kill()
            lost = seen.wait_for(r"^\S+ specialist INACTIVE", head + 4)
            # The broker frozen: the console's link goes silent past every heartbeat.
            os.kill(fleet.broker.pid, signal.SIGSTOP)
            try:
                banner = seen.wait_for(r"broker link down since \d\d:\d\d:\d\d", lost)
                for name in ("root", "coordinator", "specialist"):
                    seen.wait_for(rf"{name} unknown since \d\d:\d\d:\d\d", banner)
            finally:
                os.kill(fleet.broker.pid, signal.SIGCONT)
            back = seen.wait_for(r"broker link back", banner)
            seen.wait_for(r"root ACTIVE", back)
            # The terminal's frame: the tree for the width asked, from the same live view.
            found = ask_running(config, "/v1/watch", {"plain": False, "width": 60})
            assert found is not None, "no console answered"
            assert found[0] == 200, found
            text = found[1]["text"]
            assert "root" in text, text
            assert "specialist" in text, text
            assert all(len(line) <= 60 for line in text.splitlines()), text
        finally:
            code, err = interrupted(watch, seen)
        assert code in (0, 130), err
        assert "Traceback" not in err, err
        # No login of the watch's own: a look would log in as `<operator>-status-<hex>`.
        broker_log = fleet.broker.log_text()[mark:]
        assert f"{operator}-status-" not in broker_log, broker_log[-3000:]


def test_a_bad_watch_question_is_refused_in_words(fleet: FleetProcesses, tmp_path: Path) -> None:
    config = fleet.operator_config

    with console_serving(config, tmp_path):
        found = ask_running(config, "/v1/watch", {"plain": True, "lines": "everything"})
        assert found is not None
        status, answer = found
        assert status == 400, answer
        assert "lines: a list of agent ids" in str(answer), answer


def test_warroom_follow_prints_the_consoles_posts_as_they_come(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    config = fleet.operator_config
    operator = fleet.fleet.operator_id
    asyncio.run(route_up(fleet, "echo"))

    with console_serving(config, tmp_path):
        mark = len(fleet.broker.log_text())
        follow = piped(
            "warroom", "--follow", "--json", "--config", str(config), "--duration", "120"
        )
        seen = Lines(follow)
        try:
            # Nothing open yet: the listing is empty; then the loss, then its resolution.
            time.sleep(1.5)
            assert seen.lines == [], seen.lines
            fleet.agents["specialist"].kill()
            lost = seen.wait_for(r'"resolved": false.*"subject_name": "specialist"')
            fleet.agents["specialist"].start()
            seen.wait_for(r'"resolved": true.*"subject_name": "specialist"', lost + 1)
            # Each post once: one that came between the listing and the first question for
            # posts is in both, and printed once (cli/warroom.py).
            ids = [json.loads(line)["message_id"] for line in seen.lines]
            assert len(ids) == len(set(ids)), seen.lines
        finally:
            code, err = interrupted(follow, seen)
        assert code in (0, 130), err
        assert "Traceback" not in err, err
        broker_log = fleet.broker.log_text()[mark:]
        assert f"{operator}-status-" not in broker_log, broker_log[-3000:]
