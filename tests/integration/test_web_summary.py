"""The web console's page over statuses no fleet of daemons gives yet, in a real headless
Chromium at 1400 x 900 (docs/web.md): 10,000 agents in the tree (their counts, not 10,000
rows), and a root whose status describes its commands' parameters (the send form's fields
and checks).

The console's app is served by uvicorn over a `WebState` that took real status messages
(the MQTT path before it is the broker's, as in bench/web_console.py). The send form's
sender is the test's own: it records what would go to the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
import uvicorn
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.kits.webkit import browser, screenshot, wait
from vox_mqtt.console.web import Hub, Sender, build_app
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


def status(agent: UUID, master: UUID, name: str, state: str, **extra: Any) -> Inbound:
    report = AgentStatus(
        name=name,
        status=state,
        epoch=1,
        started_at=now_iso(),
        heartbeat_interval=3600.0,  # nobody goes STALE while the test looks
        **extra,
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=master, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=True)


@contextlib.contextmanager
def serving(state: WebState, sender: Sender | None = None) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    sock = socket.create_server(("127.0.0.1", 0))
    hub = Hub(state)
    app = build_app(hub, sender=sender)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
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


def sized(driver: WebDriver) -> None:
    """The page's viewport at exactly 1400 x 900."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )


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
        sized(driver)
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
        driver.find_element(By.LINK_TEXT, "worker04242").click()  # its own page, by its id
        wait(
            driver,
            lambda d: d.find_element(By.CSS_SELECTOR, "#page-agent h2.agent-name").text,
            30,
            "the unhealthy agent's page",
        )
        assert driver.find_element(By.CSS_SELECTOR, "#page-agent h2").text == "worker04242"
        driver.find_element(By.ID, "nav-tree").click()
        driver.find_element(By.ID, "search").send_keys("worker04242")

        def found(d: WebDriver) -> list[str]:
            names: list[str] = d.execute_script(
                "return Array.from(document.querySelectorAll('#tree tr.agent'))"
                ".filter(r => !r.hidden).map(r => r.querySelector('a.agent-link').textContent)"
            )
            return names

        assert wait(driver, found, 30, "the agent searched for") == ["root", "worker04242"]
        assert driver.find_element(By.ID, "tree-table").is_displayed()


PARAMS = {
    "linger": {
        "doc": "wait this long, then answer",
        "schema": {
            "type": "object",
            "properties": {
                "seconds": {"type": "number", "description": "how long"},
                "why": {"type": "string"},
            },
            "required": ["seconds"],
        },
    }
}


def test_the_send_form_shows_and_checks_the_parameters_the_root_describes() -> None:
    top, root = uuid4(), uuid4()
    state = WebState(FleetObserver(), top=top, top_name="operator")
    commands = ["linger", "plain"]
    state.take(status(root, top, "root", "ACTIVE", commands=commands, params=PARAMS))
    state.link(True)
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(command: str, params: dict[str, Any]) -> dict[str, Any]:
        sent.append((command, params))
        return {"ok": True, "command": command, "result": params}

    sender = Sender(commands=lambda: commands, send=send)
    with serving(state, sender) as url, browser(1400, 900) as driver:
        sized(driver)
        driver.get(url)
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#send-fields label"), 30, "fields")
        Select(driver.find_element(By.ID, "send-command")).select_by_value("linger")
        labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#send-fields label")]
        assert labels == ["seconds number, required", "why string"], labels
        assert driver.find_element(By.ID, "send-doc").text == "wait this long, then answer"
        answer = driver.find_element(By.ID, "send-answer")
        confirm = driver.find_element(By.ID, "send-confirm")
        driver.find_element(By.ID, "send-button").click()
        assert answer.text == "linger: seconds is required"
        assert not confirm.is_displayed()
        seconds = driver.find_element(By.CSS_SELECTOR, '.param-value[data-name="seconds"]')
        seconds.send_keys("soon")
        driver.find_element(By.ID, "send-button").click()
        assert answer.text == "linger: seconds must be a number"
        assert not confirm.is_displayed()
        seconds.clear()
        seconds.send_keys("2.5")
        driver.find_element(By.CSS_SELECTOR, '.param-value[data-name="why"]').send_keys("a test")
        driver.find_element(By.ID, "send-button").click()
        assert confirm.is_displayed()
        assert not answer.is_displayed()
        driver.find_element(By.ID, "send-yes").click()
        wait(driver, lambda d: answer.get_attribute("data-ok") == "1", 30, "the answer")
        screenshot(driver, "web-send-form.png")
        # The server checks the same: a request that does not fit is never sent.
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        csrf = re.search(r'name="vox-csrf" content="([0-9a-f]+)"', page)
        assert csrf is not None
        request = urllib.request.Request(
            url + "api/send",
            data=json.dumps({"command": "linger", "params": {"seconds": "x"}}).encode(),
            headers={"content-type": "application/json", "x-csrf-token": csrf.group(1)},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400
        assert json.loads(refused.value.read()) == {"error": "linger: seconds must be a number"}
    assert sent == [("linger", {"seconds": 2.5, "why": "a test"})]
