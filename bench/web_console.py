"""Figure 14: `vox web` with 1,000 agents' statuses, measured in a headless Chromium.

The console's state holds the statuses of figure 11's fleet (1,000 agents, fan-out 10,
full metrics snapshots); its Starlette app is served by uvicorn on a free loopback port.
Measured in the browser (Debian's chromium through /usr/bin/chromedriver):
- first paint: from the navigation's start to the snapshot's 1,000 rows drawn
  (`performance.now()` in the page); baseline: fetching /api/snapshot alone;
- a heartbeat round: every agent's next status handed to the console at once, until the
  page shows all 1,000 new epochs (the page's clock); baseline: the console taking them.
The MQTT path before the console is figure 11's and the broker's; it is not in here.
Without chromium or selenium the rows say so and carry no numbers (met: None).

    python -m bench.web_console [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import uvicorn

from bench.common import figure, run_alone
from bench.exporter_scrape import statuses
from vox_mqtt.console.web import Hub, build_app
from vox_mqtt.console.web_state import WebState
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol.messages import VOXMessage, new_message, parse, serialize
from vox_mqtt.transport.session import Inbound

CHROMEDRIVER = "/usr/bin/chromedriver"
_ROUND_JS = """
const done = arguments[arguments.length - 1], want = arguments[0], epoch = arguments[1];
function check() {
  const epochs = Object.values(window.voxConsole.epochs());
  if (epochs.length >= want && epochs.every(e => e >= epoch)) done(Date.now());
  else setTimeout(check, 10);
}
check();
"""


def sizes(quick: bool) -> int:
    """Return how many agents."""
    return 50 if quick else 1000


def next_round(inbound: list[Inbound]) -> list[Inbound]:
    """Return every agent's next status: the same report, one epoch on."""
    out = []
    for item in inbound:
        old: VOXMessage = parse(item.payload)
        details = dict(old.details) | {"epoch": 2}
        message = new_message(old.type, source=old.source, target=old.target, details=details)
        out.append(Inbound(topic=item.topic, payload=serialize(message), retain=False))
    return out


class _Console:
    """The console's app on uvicorn in a thread of its own, over a WebState."""

    def __init__(self) -> None:
        self.state = WebState(FleetObserver(), top=uuid4(), top_name="operator")
        self.loop = asyncio.new_event_loop()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.hub = Hub(self.state)
        config = uvicorn.Config(
            build_app(self.hub), log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        hub_task = self.loop.create_task(self.hub.run(lambda: self.server.should_exit))
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        hub_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(hub_task)
        self.loop.close()

    def take(self, inbound: list[Inbound]) -> float:
        """Hand every message to the console on its loop; return the seconds it took."""
        done = threading.Event()
        took: list[float] = []

        def apply() -> None:
            started = time.perf_counter()
            for item in inbound:
                self.state.take(item)
            took.append(time.perf_counter() - started)
            done.set()

        self.loop.call_soon_threadsafe(apply)
        assert done.wait(60), "the console did not take the statuses"
        return took[0]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@contextlib.contextmanager
def _console() -> Iterator[_Console]:
    console = _Console()
    console.thread.start()
    try:
        deadline = time.monotonic() + 15
        while not console.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield console
    finally:
        console.close()


def _skipped(agents: int, why: str) -> list[dict[str, Any]]:
    return [
        figure(
            title=f"vox web: first paint of {agents} agents (skipped: {why})",
            unit="ms", vox=0.0, baseline=0.0, target="< 1000 ms", met=None, skipped=why,
        ),
        figure(
            title=f"vox web: a heartbeat round of {agents} agents (skipped: {why})",
            unit="ms", vox=0.0, baseline=0.0, target="< 2000 ms", met=None, skipped=why,
        ),
    ]  # fmt: skip


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 14: first paint and one heartbeat round of N agents, in Chromium."""
    agents = sizes(quick)
    if shutil.which("chromium") is None or not Path(CHROMEDRIVER).exists():
        return _skipped(agents, "chromium and chromium-driver are not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return _skipped(agents, "selenium is not installed")
    first = statuses(agents)
    second = next_round(first)
    with _console() as console:
        console.take(first)
        started = time.perf_counter()
        with urllib.request.urlopen(console.url + "api/snapshot", timeout=30) as response:
            snapshot_bytes = len(response.read())
        fetch_ms = (time.perf_counter() - started) * 1000
        options = webdriver.ChromeOptions()
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_script_timeout(30)
            driver.get(console.url)
            paint_ms = _wait_paint(driver, agents)
            begun = driver.execute_script("return Date.now()")
            take_s = console.take(second)
            reflected = driver.execute_async_script(_ROUND_JS, agents, 2)
            round_ms = float(reflected - begun)
        finally:
            driver.quit()
    return [
        figure(
            title=f"vox web: first paint of {agents} agents' statuses in Chromium",
            unit="ms",
            vox=paint_ms,
            baseline=fetch_ms,
            target="< 1000 ms",
            met=paint_ms < 1000,
            agents=agents,
            snapshot_bytes=snapshot_bytes,
        ),
        figure(
            title=f"vox web: a heartbeat round of {agents} agents reflected in Chromium",
            unit="ms",
            vox=round_ms,
            baseline=take_s * 1000,
            target="< 2000 ms",
            met=round_ms < 2000,
            agents=agents,
        ),
    ]


def _wait_paint(driver: Any, agents: int) -> float:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        painted = driver.execute_script(
            "const p = window.voxConsole; return p && p.firstPaint !== null"
            " && document.querySelectorAll('#tree tr.agent').length >= arguments[0]"
            " ? p.firstPaint : null",
            agents,
        )
        if painted is not None:
            return float(painted)
        time.sleep(0.02)
    raise AssertionError(f"the page did not draw {agents} agents within 30 s")


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
