"""`vox web` over a fleet of real daemons, driven in a real headless Chromium (docs/web.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.kits.brokerkit import NO_MATCHING_SUBSCRIBERS, SUCCESS, Client
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.webkit import browser, click_found, row_of, run_web, screenshot, state_of, wait
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    new_message,
    now_iso,
    serialize,
)

pytestmark = pytest.mark.slow

SHAPE = {"root": None, "specialist": "root", "helper": "root", "mallory": "root"}
ROLES = {"specialist": ["tests.kits.agentkit:Analyst"], "helper": ["tests.kits.agentkit:Slow"]}
RUNNING = ("specialist", "helper", "root")  # mallory's daemon never runs: the test speaks as it
KEEPALIVE = 5
# docs/liveness.md: a killed process's will is published at once; a silent host's after
# about 1.5 x keepalive plus Mosquitto's check period. The bound covers the slower case.
LIVENESS_BOUND = 1.5 * KEEPALIVE + 5
# Markup in every free-text field a compromised agent controls; window.__xss is the sentinel.
IMG = '<img src=x onerror="window.__xss=(window.__xss||0)+1">'
SCRIPT = "<script>window.__xss=2</script>"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcesses]:
    text = fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)
    root = tmp_path_factory.mktemp("webfleet")
    with run_fleet(root / "fleet", text, keepalive=KEEPALIVE, start=False) as procs:
        for name in RUNNING:
            procs.agents[name].start()
        yield procs


def all_active(driver: WebDriver) -> bool:
    return all(state_of(driver, name) == "ACTIVE" for name in RUNNING)


def test_tree_and_war_room_follow_a_kill_and_a_restart_without_reload(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    specialist = str(fleet.fleet.agent("specialist").id)
    with run_web(fleet.operator_config, tmp_path / "web.log") as web, browser() as driver:
        driver.get(web.url)
        wait(driver, all_active, 30, "root, specialist and helper ACTIVE in the tree")
        loaded_at = driver.execute_script("return window.voxConsole.loadedAt")
        names = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#tree a.agent-link")]
        assert sorted(names) == sorted(RUNNING)
        # It reads as the operator's read-only look, never as the operator itself.
        operator = fleet.broker_dir.credentials_for(fleet.fleet.operator_name)
        look = operator.look("watch")
        assert look is not None
        assert look.username != operator.username
        assert f"u'{look.username}'" in fleet.broker.log_tail(400)
        assert (
            f"connected to the broker at 127.0.0.1:{fleet.broker_dir.port} as {look.username}"
            in (web.log())
        )
        # The tree: the root's children are drawn below it, indented.
        depth = driver.execute_script(
            "return Array.from(document.querySelectorAll('#tree tr.agent'))"
            ".map(r => [r.querySelector('a').textContent, r.style.getPropertyValue('--depth')])"
        )
        assert dict(depth) == {"root": "0", "specialist": "1", "helper": "1"}
        assert "ms" in row_of(driver, "root").text or "-" in row_of(driver, "root").text
        # The search box finds an agent by name.
        search = driver.find_element(By.ID, "search")
        search.send_keys("help")
        wait(driver, lambda d: not row_of(d, "specialist").is_displayed(), 5, "filtered tree")
        assert row_of(driver, "helper").is_displayed()
        assert row_of(driver, "root").is_displayed()
        search.clear()
        search.send_keys(specialist[:8])
        wait(driver, lambda d: not row_of(d, "helper").is_displayed(), 5, "id prefix search")
        assert row_of(driver, "specialist").is_displayed()
        search.clear()
        driver.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")
        wait(driver, lambda d: row_of(d, "helper").is_displayed(), 5, "the whole tree again")
        screenshot(driver, "web-tree.png")

        # Read-only: no control to send exists, and a forged POST is refused.
        assert driver.find_elements(By.ID, "send-form") == []
        csrf = driver.execute_script("return document.querySelector('meta[name=vox-csrf]').content")
        status, body = web.request(
            "POST",
            "api/send",
            body=json.dumps({"command": "analyze", "params": {"target": "x"}}).encode(),
            headers={"content-type": "application/json", "x-csrf-token": csrf},
        )
        assert status == 403, body
        assert b"--allow-send" in body

        killed = time.monotonic()
        fleet.agents["specialist"].kill()
        wait(
            driver,
            lambda d: state_of(d, "specialist") == "INACTIVE",
            LIVENESS_BOUND,
            "specialist INACTIVE",
        )
        driver.find_element(By.ID, "nav-warroom").click()
        incident = f"#incidents-open tr.incident[data-subject='{specialist}']"
        wait(
            driver,
            lambda d: d.find_elements(By.CSS_SELECTOR, incident),
            max(0.5, LIVENESS_BOUND - (time.monotonic() - killed)),
            "the incident about specialist in the war room",
        )
        # Read within a wait: the page may redraw the row between finding it and reading it
        # (a batch from the stream), and a row found before is then stale (seen once).
        text = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, incident).text, 5, "its text")
        assert "specialist" in text
        assert "root" in text
        assert driver.find_element(By.ID, "open-count").text != "0"
        screenshot(driver, "web-warroom.png")

        fleet.agents["specialist"].start()
        resolved = f"#incidents-resolved tr.resolved[data-subject='{specialist}']"
        wait(
            driver,
            lambda d: (
                not d.find_elements(By.CSS_SELECTOR, incident)
                and d.find_elements(By.CSS_SELECTOR, resolved)
            ),
            30,
            "the incident resolved",
        )
        driver.find_element(By.ID, "nav-tree").click()
        wait(driver, lambda d: state_of(d, "specialist") == "ACTIVE", 10, "specialist ACTIVE")
        # All of it arrived on the one event stream of the page first loaded: no reload.
        probe = driver.execute_script("return window.voxConsole")
        assert probe["loadedAt"] == loaded_at
        assert probe["snapshots"] == 1
        assert probe["batches"] > 0
        assert driver.find_element(By.ID, "link").text == "live"
    assert web.process.returncode == 0, web.log()  # SIGTERM: a clean stop


def test_allow_send_sends_from_the_page_and_shows_the_answer(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    with (
        run_web(fleet.operator_config, tmp_path / "web.log", "--allow-send") as web,
        browser() as driver,
    ):
        driver.get(web.url)
        wait(
            driver,
            lambda d: (
                "analyze"
                in [
                    o.get_attribute("value")
                    for o in d.find_elements(By.CSS_SELECTOR, "#send-command option")
                ]
            ),
            30,
            "the root's analyze command offered",
        )
        Select(driver.find_element(By.ID, "send-command")).select_by_value("analyze")
        driver.find_element(By.ID, "send-params").send_keys('{"target": "abcd"}')
        driver.find_element(By.ID, "send-button").click()
        confirm = driver.find_element(By.ID, "send-confirm")
        assert confirm.is_displayed()
        assert "analyze" in confirm.text
        assert not driver.find_element(By.ID, "send-answer").is_displayed()  # nothing sent yet
        driver.find_element(By.ID, "send-yes").click()
        wait(
            driver,
            lambda d: d.find_element(By.ID, "send-answer").get_attribute("data-ok") == "1",
            30,
            "the answer on the page",
        )
        answer = driver.find_element(By.ID, "send-answer")
        assert '"findings":4' in answer.text
        assert '"by":"specialist"' in answer.text
        # A POST without the page's CSRF token is refused, even here.
        status, body = web.request(
            "POST",
            "api/send",
            body=json.dumps({"command": "analyze", "params": {"target": "x"}}).encode(),
            headers={"content-type": "application/json"},
        )
        assert status == 403
        assert b"CSRF" in body


def test_a_token_guards_every_request(fleet: FleetProcesses, tmp_path: Path) -> None:
    with (
        run_web(fleet.operator_config, tmp_path / "web.log", "--generate-token") as web,
        browser() as driver,
    ):
        assert web.token_url is not None
        token = web.token_url.split("?token=")[1]
        for path in ("", "api/snapshot", "api/events", "static/app.js"):
            status, _ = web.get(path)
            assert status == 401, path
        assert web.get("api/snapshot", {"authorization": "Bearer wrong-token-123456"})[0] == 401
        status, body = web.get("api/snapshot", {"authorization": f"Bearer {token}"})
        assert status == 200
        assert json.loads(body)["agents"]
        # The printed URL: the browser keeps the token as a cookie and loads the console.
        driver.get(web.token_url)
        wait(driver, all_active, 30, "the tree behind the token")
        assert "token" not in driver.current_url


def forged(fleet: FleetProcesses) -> tuple[bytes, bytes]:
    """Return a retained status and a war-room post of mallory's, markup in every text."""
    mallory = fleet.fleet.agent("mallory").id
    status = AgentStatus(
        name=IMG,
        status="DEGRADED",
        error_code=SCRIPT,
        epoch=1,
        started_at=now_iso(),
        heartbeat_interval=3600.0,
        version=IMG[:64],
        detail=IMG + SCRIPT,
    )
    root = fleet.fleet.agent("root").id
    report = new_message(MSG_AGENT_STATUS, source=mallory, target=root, details=status)
    failure = SystemFailure(
        error_code=SCRIPT + IMG, severity="CRITICAL", description=IMG + " and " + SCRIPT
    )
    post = new_message(
        MSG_SYSTEM_FAILURE, source=mallory, target=topics.WARROOM_ID, details=failure
    )
    return serialize(report), serialize(post)


def test_markup_from_an_agent_is_shown_as_text_and_never_runs(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    mallory = fleet.fleet.agent("mallory").id
    client = Client(fleet.broker_dir.credentials_for("mallory"))
    assert client.connect() == 0
    status, post = forged(fleet)
    status_topic, post_topic = topics.status(mallory), topics.warroom(mallory, mallory)
    try:
        # Retained either way: "no matching subscribers" is what the broker answers when the
        # root has not subscribed yet (this test run alone, right after the fleet starts).
        accepted = (SUCCESS, NO_MATCHING_SUBSCRIBERS)
        assert client.publish(status_topic, status, retain=True) in accepted
        assert client.publish(post_topic, post, retain=True) in accepted
        with run_web(fleet.operator_config, tmp_path / "web.log") as web, browser() as driver:
            driver.get(web.url)
            wait(driver, lambda d: row_of(d, IMG) is not None, 30, "mallory's row, named as text")
            row = row_of(driver, IMG)
            assert SCRIPT in row.find_element(By.CSS_SELECTOR, ".state").text
            driver.find_element(By.ID, "nav-warroom").click()
            mine = f"#incidents-open tr.incident[data-subject='{mallory}']"
            # Read whole inside the wait: a batch the page applies meanwhile re-renders the
            # table, and cells found before it are stale (wait retries on that).
            texts = wait(
                driver,
                lambda d: (
                    [
                        c.text
                        for c in d.find_element(By.CSS_SELECTOR, mine).find_elements(
                            By.TAG_NAME, "td"
                        )
                    ]
                    if d.find_elements(By.CSS_SELECTOR, mine)
                    else None
                ),
                10,
                "mallory's post",
            )
            assert SCRIPT + IMG in texts
            assert IMG + " and " + SCRIPT in texts
            assert IMG in texts
            # Its own page: name and version as text too.
            driver.find_element(By.ID, "nav-tree").click()
            click_found(
                driver,
                lambda d: row_of(d, IMG).find_element(By.CSS_SELECTOR, "a.agent-link"),
                "the image agent's link",
            )
            wait(
                driver,
                lambda d: d.find_elements(By.CSS_SELECTOR, "#page-agent h2.agent-name"),
                10,
                "mallory's page",
            )
            assert driver.find_element(By.CSS_SELECTOR, "#page-agent h2.agent-name").text == IMG
            assert IMG[:64] in driver.find_element(By.ID, "page-agent").text
            # No element was made of the agents' markup, and the sentinel never ran.
            assert driver.find_elements(By.CSS_SELECTOR, "main img, main script") == []
            assert driver.execute_script("return window.__xss === undefined")
    finally:
        client.publish(status_topic, b"", retain=True)
        client.publish(post_topic, b"", retain=True)
        client.close()
