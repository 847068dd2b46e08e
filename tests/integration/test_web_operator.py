"""The web console does what the CLI does and tells the truth (docs/web.md), in a real
headless Chromium at 1400 x 900 against `vox console serve --web` and a fleet of daemons.

The broker frozen with SIGSTOP turns every row "unknown since" within one heartbeat interval
plus 2 s, and back on SIGCONT; two jobs are decided from the inbox page (one approved, one
rejected) and `vox inbox` agrees; a request sent from the page is cancelled from its page,
which shows every level; a resolved incident is still listed after the console restarts.
Each page is written as a screenshot (`VOX_DOC_SCREENSHOTS=1` also into docs/).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, fleet_text, run_fleet, serving_vox
from tests.kits.freelancekit import drop, future_mail, job_mail
from tests.kits.webkit import browser, click_found, run_web, screenshot, wait

pytestmark = pytest.mark.slow

HEARTBEAT = 1.0
SHAPE = {"root": None, "coord": "root", "mail": "coord", "spec": "coord"}
ROLES = {
    "root": ["examples.freelance:Root"],
    "coord": ["examples.freelance:Coordinator"],
    "mail": ["examples.freelance:MailWatcher"],
    "spec": ["tests.kits.webroles:Notifier"],
}
NAMES = tuple(SHAPE)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcesses]:
    tmp = tmp_path_factory.mktemp("webop")
    intake = tmp / "intake"
    intake.mkdir()
    settings = {"mail": {"intake_dir": str(intake), "poll_interval": 0.05, "settle": 0.05}}
    text = fleet_text(SHAPE, roles=ROLES, settings=settings, heartbeat=HEARTBEAT)
    with run_fleet(tmp / "fleet", text) as procs:
        yield procs


def vox(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A verb through the running console (the suite's one-shot default dropped)."""
    env = child_env()
    env.pop("VOX_CONSOLE", None)
    return subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        check=False,
    )


def serve(config: Path, log: Path) -> Any:
    def ready(text: str) -> str | None:
        found = re.search(r"serving (http://\S+/) ", text)
        return None if found is None or "listening on" not in text else found.group(1)

    args = ["console", "serve", "--config", str(config), "--web", "127.0.0.1:0"]
    return serving_vox(args, log, ready, "vox console serve")


def sized(driver: WebDriver) -> WebDriver:
    """The page's viewport at exactly 1400 x 900 (the window's own size includes no bars)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


def rows(driver: WebDriver) -> dict[str, dict[str, str]]:
    found: list[list[str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tree tr.agent')).map(r => ["
        "r.querySelector('a.agent-link').textContent, r.dataset.state, r.dataset.unknown,"
        "r.querySelector('td.state').textContent, r.querySelectorAll('td')[2].textContent])"
    )
    return {n: {"state": s, "unknown": u, "text": t, "age": a} for n, s, u, t, a in found}


def all_active(driver: WebDriver) -> bool:
    shown = rows(driver)
    return set(NAMES) <= set(shown) and all(
        shown[n]["state"] == "ACTIVE" and shown[n]["unknown"] == "0" for n in NAMES
    )


def jobs_shown(driver: WebDriver) -> dict[int, dict[str, str]]:
    found: list[list[str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#inbox-list .notification[data-job]'))"
        ".map(b => [b.dataset.job, b.dataset.decision, b.querySelector('.job-state').textContent,"
        "(b.querySelector('.decide-answer') || {}).textContent || ''])"
    )
    return {int(n): {"decision": d, "line": line, "answer": a} for n, d, line, a in found}


def decide(driver: WebDriver, number: int, verdict: str, note: str) -> None:
    """Type the note and click; the page may redraw the inbox meanwhile (a note kept)."""
    box = f'#inbox-list .notification[data-job="{number}"]'

    def typed(d: WebDriver) -> bool:
        field = d.find_element(By.CSS_SELECTOR, f"{box} .decide-note")
        if field.get_attribute("value") != note:
            field.clear()
            field.send_keys(note)
        return d.find_element(By.CSS_SELECTOR, f"{box} .decide-note").get_attribute("value") == note

    wait(driver, typed, 10, f"the note of #{number} typed")

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, f"{box} .decide-{verdict}").click()
        return True

    wait(driver, clicked, 10, f"#{number}'s {verdict} button clicked")
    wait(driver, lambda d: jobs_shown(d)[number]["decision"] == verdict, 60, f"#{number} {verdict}")


def test_the_web_console_does_what_the_cli_does_and_says_what_it_does_not_know(
    fleet: FleetProcesses, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = fleet.operator_config
    intake = fleet.root.parent / "intake"
    with serve(config, tmp_path / "console.log") as (_console, url), browser(1400, 900) as driver:
        sized(driver)
        driver.get(url)
        wait(driver, all_active, 60, "every agent ACTIVE on the page")
        wait(
            driver,
            lambda d: (
                "linger"
                in [
                    str(o.get_attribute("value"))
                    for o in d.find_elements(By.CSS_SELECTOR, "#send-command option")
                ]
            ),
            60,
            "the spec's linger command offered by the root",
        )
        # The send form shows nothing to confirm before anything is asked.
        assert not driver.find_element(By.ID, "send-confirm").is_displayed()
        assert not driver.find_element(By.ID, "send-answer").is_displayed()

        # --- the broker frozen: every row unknown since, the banner first; back on SIGCONT --
        os.kill(fleet.broker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait(
                driver,
                lambda d: all(rows(d)[n]["unknown"] == "1" for n in NAMES),
                HEARTBEAT + 2,
                "every row unknown within one heartbeat interval plus 2 s",
            )
            took = time.monotonic() - stopped
            banner = driver.find_element(By.ID, "banner")
            assert banner.is_displayed()
            assert banner.location["y"] < driver.find_element(By.ID, "tree-table").location["y"]
            since = banner.text.split("broker link down since ")[1].split(",")[0]
            assert re.fullmatch(r"\d\d:\d\d:\d\d", since), banner.text
            assert banner.text.endswith(f"every agent unknown since {since}")
            counts = driver.find_element(By.ID, "counts").text
            assert counts == f"4 agents, every one unknown since {since}", counts
            shown = rows(driver)
            for name in NAMES:
                assert shown[name]["text"] == f"unknown since {since}"
                assert shown[name]["age"] == "-"  # ages stop
            screenshot(driver, "web-link-down.png")
        finally:
            os.kill(fleet.broker.pid, signal.SIGCONT)
        wait(driver, all_active, 30, "every row back after SIGCONT")
        assert not driver.find_element(By.ID, "banner").is_displayed()
        print(f"every row unknown {took:.2f}s after SIGSTOP")

        # --- two jobs, one approved and one rejected from the inbox page -------------------
        drop(intake, "1-a.eml", future_mail(9, 13, 180, 10))
        driver.get(url + "#inbox")
        wait(driver, lambda d: 1 in jobs_shown(d), 60, "job #1 in the inbox")
        drop(intake, "2-b.eml", future_mail(10, 12, 60, 20))
        wait(driver, lambda d: 2 in jobs_shown(d), 60, "job #2 in the inbox")
        jobs = jobs_shown(driver)
        assert jobs[1]["line"] == "undecided; overlaps no undecided job"
        assert jobs[2]["line"] == "undecided; overlaps #1 (undecided)"
        decide(driver, 1, "approve", "yes please")
        decide(driver, 2, "reject", "it overlaps #1")
        jobs = jobs_shown(driver)
        assert jobs[1]["line"].startswith("approved at ")
        assert jobs[1]["answer"].startswith("job #1 approved: booked: 180 min of work")
        assert jobs[2]["line"].startswith("rejected at ")
        # A job whose window ended is refused on the page, in `vox decide`'s words.
        past = "2026-01-12T09:00:00+00:00", "2026-01-12T17:00:00+00:00"
        drop(intake, "3-past.eml", job_mail(*past, effort=60, price="20 USD"))
        wait(driver, lambda d: 3 in jobs_shown(d), 60, "job #3 in the inbox")
        box = '#inbox-list .notification[data-job="3"]'
        driver.find_element(By.CSS_SELECTOR, f"{box} .decide-approve").click()
        refusal = wait(
            driver,
            lambda d: (
                d.find_element(By.CSS_SELECTOR, f"{box} .decide-answer").text
                if d.find_element(By.CSS_SELECTOR, f"{box} .decide-answer").get_attribute("data-ok")
                == "0"
                else ""
            ),
            60,
            "job #3's refusal",
        )
        assert refusal == f"decide #3 approve: job #3 expired: its window ended at {past[1]}"
        assert jobs_shown(driver)[3]["decision"] == ""
        screenshot(driver, "web-inbox-decided.png")
        # The CLI agrees, and refuses as the page does: a decision is final.
        listed = vox("inbox", "--config", config, "--wait", "0", "--json", "--keep-unread")
        assert listed.returncode == 0, listed.stderr
        verdicts = {
            e["job"]: (e["decision"] or {}).get("verdict")
            for e in json.loads(listed.stdout)
            if "job" in e
        }
        assert verdicts == {1: "approve", 2: "reject", 3: None}
        again = vox("decide", "--config", config, "2", "approve")
        assert again.returncode == 2
        assert "job #2 was already rejected" in again.stderr

        # --- a request started from the page, shown at every level, cancelled from it -------
        driver.get(url + "#tree")
        wait(driver, all_active, 30, "the tree again")
        Select(driver.find_element(By.ID, "send-command")).select_by_value("linger")
        field = driver.find_element(By.ID, "send-params")
        field.clear()
        field.send_keys("not json")
        driver.find_element(By.ID, "send-button").click()
        answer = driver.find_element(By.ID, "send-answer")
        assert answer.text.startswith("linger: params are not JSON"), answer.text
        assert not driver.find_element(By.ID, "send-confirm").is_displayed()
        field.clear()
        field.send_keys(json.dumps({"seconds": 120}))
        driver.find_element(By.ID, "send-button").click()
        assert driver.find_element(By.ID, "send-confirm").is_displayed()
        driver.find_element(By.ID, "send-yes").click()
        driver.get(url + "#requests")

        def listed_row(d: WebDriver) -> list[str]:
            found: list[str] | None = d.execute_script(
                "const r = document.querySelector('#requests-table tr[data-command=\"linger\"]');"
                "return r && [r.querySelector('td.to').textContent,"
                "r.querySelector('td.door').textContent, r.dataset.messageId]"
            )
            # The door is noted in the ledger just after the request: the page follows.
            return found if found and found[1] else []

        cells: list[str] = wait(driver, listed_row, 30, "the linger request listed with its door")
        assert cells[:2] == ["root", "web"], cells
        screenshot(driver, "web-requests-sent.png")
        driver.get(url + "#request/" + cells[2])

        def levels(d: WebDriver) -> list[str]:
            found: list[str] = d.execute_script(
                "return Array.from(document.querySelectorAll('#request-levels p.level'))"
                ".map(p => p.textContent)"
            )
            return found

        wait(driver, lambda d: len(levels(d)) == 3, 30, "the request at every level")
        at_levels = levels(driver)
        assert at_levels[0].startswith("root: "), at_levels
        assert [line.split(":")[0] for line in at_levels] == ["root", "└ level 2", "└ level 3"]
        facts, page = driver.execute_script(
            "return [document.querySelector('.request-facts').textContent,"
            "document.getElementById('page-request').innerText]"
        )
        assert facts.startswith("to root, through web"), facts
        assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", page), page  # names, never ids
        # The page redraws from each poll: what was found a moment ago may be gone by the
        # next step, and is found again (tests/kits/webkit.py, click_found).
        wait(
            driver,
            lambda d: (
                d.find_element(By.CSS_SELECTOR, ".cancel-reason").send_keys("not needed") or True
            ),
            10,
            "the cancel's reason typed",
        )
        click_found(driver, lambda d: d.find_element(By.ID, "request-cancel"), "the cancel button")
        wait(
            driver,
            lambda d: d.find_element(By.ID, "cancel-answer").get_attribute("data-ok") in ("0", "1"),
            30,
            "the cancel's answer",
        )
        ok, text = driver.execute_script(
            "const a = document.getElementById('cancel-answer'); return [a.dataset.ok, a.innerText]"
        )
        assert ok == "1", text
        # What the cancel has done, one line: canceled, or canceling and which level not yet.
        assert text.startswith(("cancel: canceled", "cancel: canceling")), text
        wait(
            driver,
            lambda d: (
                d.find_element(By.CSS_SELECTOR, ".request-state").get_attribute("data-state")
                in ("FAILED", "ANSWERED", "EXPIRED")
            ),
            60,
            "the request ended",
        )
        wait(driver, lambda d: len(levels(d)) == 3, 30, "every level after the cancel")
        screenshot(driver, "web-request.png")

        # --- an incident resolved, then the console restarted: still listed ---------------
        fleet.agents["mail"].kill()
        driver.get(url + "#warroom")
        wait(
            driver,
            lambda d: d.find_elements(By.CSS_SELECTOR, "#incidents-open tr.incident"),
            60,
            "the lost child's incident",
        )
        fleet.agents["mail"].start()
        resolved = "#incidents-resolved tr.resolved"
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, resolved), 60, "it resolved")
    with serve(config, tmp_path / "console2.log") as (_console, url), browser(1400, 900) as driver:
        sized(driver)
        driver.get(url + "#warroom")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, resolved), 30, "still resolved")
        subject = driver.find_element(By.CSS_SELECTOR, f"{resolved} td.subject").text
        assert subject == "mail"
        screenshot(driver, "web-warroom-resolved.png")
        driver.get(url + "#tree")
        wait(driver, all_active, 60, "every agent ACTIVE after the restart")
        screenshot(driver, "web-tree-1400.png")
        # `vox web --allow-send` is a client of that console: the same pages, the same acts.
        monkeypatch.delenv("VOX_CONSOLE", raising=False)  # run_web's child: through it
        with run_web(config, tmp_path / "web.log", "--allow-send") as web:
            driver.get(web.url + "#request/" + cells[2])
            wait(driver, lambda d: len(levels(d)) == 3, 30, "every level through vox web")
            driver.get(web.url + "#inbox")
            wait(driver, lambda d: len(jobs_shown(d)) == 3, 30, "the jobs through vox web")
            lines = {n: j["line"].split(" at ")[0] for n, j in jobs_shown(driver).items()}
            assert lines == {
                1: "approved",
                2: "rejected",
                3: "undecided; overlaps no undecided job",
            }
