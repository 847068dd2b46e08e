"""A fleet of 10,000 agents in the web console's tree: its counts, not 10,000 rows
(docs/web.md), in a real headless Chromium at 1400 x 900.

The console's app is served by uvicorn over a `WebState` that took 10,000 real status
messages (the MQTT path before it is the broker's, as in bench/web_console.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
import uvicorn
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.kits.webkit import browser, screenshot, wait
from vox_mqtt.console.web import Hub, build_app
from vox_mqtt.console.web_state import WebState
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.transport.session import Inbound

pytestmark = pytest.mark.slow

AGENTS = 10_000


def status(agent: UUID, master: UUID, name: str, state: str) -> Inbound:
    report = AgentStatus(
        name=name,
        status=state,  # type: ignore[arg-type]
        epoch=1,
        started_at=now_iso(),
        heartbeat_interval=3600.0,  # nobody goes STALE while the test looks
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=master, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=True)


@contextlib.contextmanager
def serving(state: WebState) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    sock = socket.create_server(("127.0.0.1", 0))
    hub = Hub(state)
    server = uvicorn.Server(
        uvicorn.Config(build_app(hub), log_level="warning", lifespan="off", access_log=False)
    )

    def run() -> None:
        asyncio.set_event_loop(loop)
        pushing = loop.create_task(hub.run(lambda: server.should_exit))
        loop.run_until_complete(server.serve(sockets=[sock]))
        pushing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(pushing)
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def test_ten_thousand_agents_are_summarised_and_found_by_name() -> None:
    top = uuid4()
    state = WebState(FleetObserver(), top=top, top_name="operator")
    root = uuid4()
    state.take(status(root, top, "root", "ACTIVE"))
    for n in range(AGENTS - 1):
        sick = {17: "INACTIVE", 4242: "DEGRADED"}.get(n, "ACTIVE")
        state.take(status(uuid4(), root, f"worker{n:05d}", sick))
    state.link(True)
    with serving(state) as url, browser(1400, 900) as driver:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get(url)
        head = wait(
            driver,
            lambda d: d.find_element(By.CSS_SELECTOR, "#summary .summary-head").text,
            60,
            "the summary",
        )
        assert head.startswith("10000 agents: 1 INACTIVE, 1 DEGRADED, 9998 ACTIVE"), head
        assert not driver.find_element(By.ID, "tree-table").is_displayed()
        unhealthy = [
            e.text for e in driver.find_elements(By.CSS_SELECTOR, "#summary .summary-unhealthy")
        ]
        assert unhealthy == [
            "worker00017 INACTIVE (site this site)",
            "worker04242 DEGRADED (site this site)",
        ]
        drawn: int = driver.execute_script("return document.querySelectorAll('#tree tr').length")
        assert drawn == 0  # no row laid out for nobody to read
        screenshot(driver, "web-summary.png")
        driver.find_element(By.ID, "search").send_keys("worker04242")

        def found(d: WebDriver) -> list[str]:
            names: list[str] = d.execute_script(
                "return Array.from(document.querySelectorAll('#tree tr.agent'))"
                ".filter(r => !r.hidden).map(r => r.querySelector('a.agent-link').textContent)"
            )
            return names

        assert wait(driver, found, 30, "the agent searched for") == ["root", "worker04242"]
        assert driver.find_element(By.ID, "tree-table").is_displayed()
