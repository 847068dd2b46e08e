"""The operator's console on real daemons (docs/operations.md, "The operator's console").

operator -> root -> coordinator -> specialist (tests/kits/lifecyclekit.py). One `vox console
serve --web` is the operator; a `vox send --follow` of a command that runs until cancelled,
a `vox cancel` of it from a second process and a headless Chromium sending another command
from the console's web page all go through it at once: the follower prints CANCELED, the
page gets its answer, the specialist's handler saw the cancel, and nothing anywhere (the
verbs, the console, the broker) says a session was taken over.

These verbs run without the suite's VOX_CONSOLE=one-shot (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, serving_vox
from tests.kits.lifecyclekit import event_at, ledger_rows, lifecycle_fleet, route_up, until
from tests.kits.webkit import browser, wait
from vox_mqtt.cli._home import ask_console, state_dir_of

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]
TAKEN_OVER = ("lost the connection", "already connected")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("console-home")) as found:
        yield found


def client_env() -> dict[str, str]:
    """A verb's environment: through the console (the suite's one-shot default dropped)."""
    env = child_env()
    env.pop("VOX_CONSOLE", None)
    return env


def vox(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
        capture_output=True, text=True, env=client_env(), cwd=REPO, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def vox_process(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=client_env(), cwd=REPO,
    )  # fmt: skip


async def test_follow_cancel_and_web_send_at_once_through_one_console(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    procs, events_file = fleet
    config = procs.operator_config
    monkeypatch.setenv("VOX_CONSOLE", os.environ.get("VOX_CONSOLE", ""))
    # Before the console starts: this wait logs in as the operator itself.
    await route_up(procs, "stuck")
    broker_log_start = len(procs.broker.log_text())
    console_log = tmp_path / "console.log"

    def ready(log: str) -> str | None:
        found = re.search(r"serving (http://\S+/) ", log)
        return None if found is None or "listening on" not in log else found.group(1)

    serve = ["console", "serve", "--config", str(config), "--web", "127.0.0.1:0"]
    with serving_vox(serve, console_log, ready, "vox console serve") as (_process, url):
        state_dir = state_dir_of(config)
        sock = state_dir / "console.sock"
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700

        follower = vox_process("send", "--config", config, "stuck", "n=1", "--follow",
                               "--timeout", "600")  # fmt: skip
        try:
            await until(lambda: event_at(events_file, "started", 1), "the handler to start", 60)
            assert follower.stdout is not None
            first = await asyncio.to_thread(follower.stdout.readline)
            request_id = first.strip().removeprefix("request ")
            assert re.fullmatch(r"[0-9a-f-]{36}", request_id), first

            async def web_send() -> str:
                def drive() -> str:
                    with browser() as driver:
                        driver.get(url)
                        wait(driver, lambda d: "echo" in [
                            str(o.get_attribute("value"))
                            for o in d.find_elements(By.CSS_SELECTOR, "#send-command option")
                        ], 60, "the root's commands on the page")  # fmt: skip
                        driver.find_element(By.ID, "nav-tree").click()
                        Select(driver.find_element(By.ID, "send-command")).select_by_value("echo")
                        field = driver.find_element(By.ID, "send-params")
                        field.clear()
                        field.send_keys(json.dumps({"text": "from the page"}))
                        driver.find_element(By.ID, "send-button").click()
                        driver.find_element(By.ID, "send-yes").click()
                        wait(
                            driver,
                            lambda d: d.find_element(By.ID, "send-answer").text.startswith("echo:"),
                            60,
                            "the page's answer",
                        )
                        return str(driver.find_element(By.ID, "send-answer").text)

                return await asyncio.to_thread(drive)

            async def cancel() -> subprocess.CompletedProcess[str]:
                # From a second process, while the follower and the page hold theirs.
                await asyncio.sleep(1.0)
                return await asyncio.to_thread(
                    vox, "cancel", request_id[:8], "--config", config, "--reason", "enough"
                )

            answer, canceled = await asyncio.gather(web_send(), cancel())
            out, err = await asyncio.to_thread(follower.communicate, timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait(10)
        assert "from the page" in answer, answer
        rows = ledger_rows(state_dir_of(config) / "logs.db")
        acts = [json.loads(r["details"]) for r in rows if r["event_type"] == "door"]
        assert {"door": "web", "what": "command", "command": "echo"}.items() <= next(
            (a for a in acts if a["door"] == "web"), {}
        ).items(), acts  # the page's send is audited as the web door's
        assert canceled.returncode == 0, (canceled.stdout, canceled.stderr)
        assert f"request {request_id}: canceled" in canceled.stdout
        assert follower.returncode == 1, (out, err)
        assert re.search(r" canceled CANCELED: ", out), out
        assert "stuck: CANCELED: " in err, err
        await until(lambda: event_at(events_file, "cancelled", 1), "the handler's cancel")

        # The console's live view rides on the operator's session: status and war room.
        status = vox("status", "--config", config, "--json")
        assert status.returncode == 0, status.stderr
        states = {a["name"]: a["status"] for a in json.loads(status.stdout)["agents"]}
        assert states.get("specialist") == "ACTIVE", states
        os.environ.pop("VOX_CONSOLE", None)  # restored by the fixture's monkeypatch
        through = await asyncio.to_thread(ask_console, Path(config), "/v1/status", {"json": True})
        assert through is not None, "status did not ask the console"
        assert "document" in through
        warroom = vox("warroom", "--config", config)
        assert warroom.returncode == 0, warroom.stderr
        assert warroom.stdout.startswith("open incidents: "), warroom.stdout
        shown = vox("request", "show", request_id, "--config", config, "--json")
        assert shown.returncode == 0, shown.stderr
        report = json.loads(shown.stdout)
        assert report["state"] == "canceled"
        # Every door is audited: the command and its cancel came through the CLI.
        assert report["door"] == "cli", report
        assert [(d["door"], d["what"]) for d in report["doors"]] == [
            ("cli", "command"),
            ("cli", "cancel"),
        ], report
        in_words = vox("request", "show", request_id, "--config", config)
        assert in_words.returncode == 0, in_words.stderr
        assert "came through cli (command), cli (cancel)" in in_words.stdout, in_words.stdout
        stopped = vox("console", "stop", "--config", config)
        assert stopped.returncode == 0, stopped.stderr
        code = await asyncio.to_thread(_process.wait, 30)
        assert code == 0, console_log.read_text()
    assert not sock.exists()
    texts = {
        "follower": out + err,
        "cancel": canceled.stdout + canceled.stderr,
        "console": console_log.read_text(),
        "broker": procs.broker.log_text()[broker_log_start:],
    }
    assert "Traceback" not in texts["console"], texts["console"]
    for where, text in texts.items():
        for words in TAKEN_OVER:
            assert words not in text, f"{where} says {words!r}:\n{text[-3000:]}"


async def test_a_verb_starts_a_console_that_stops_after_its_last_client(fleet: Fleet) -> None:
    procs, _ = fleet
    config = procs.operator_config
    await route_up(procs, "echo")
    env_idle = {"VOX_CONSOLE_IDLE": "3"}
    os.environ.update(env_idle)
    try:
        sent = vox("send", "--config", config, "echo", "text=hi", "--json")
    finally:
        for key in env_idle:
            os.environ.pop(key, None)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["result"] == "hi"
    status = vox("console", "status", "--config", config, "--json")
    assert status.returncode == 0, status.stderr
    pid = json.loads(status.stdout)["pid"]
    # One-shot beside it is refused in one line: it would log in as the operator too.
    one_shot = vox("send", "--config", config, "echo", "--one-shot")
    assert one_shot.returncode == 2
    assert one_shot.stderr.count("\n") == 1
    assert "another process is the operator" in one_shot.stderr
    await until(lambda: not _alive(pid), "the idle console to stop", 60)
    log = (state_dir_of(config) / "console.log").read_text()
    assert "no client for 3s: stopping" in log, log
    for words in TAKEN_OVER:
        assert words not in log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours is gone for this purpose; the console is not our child.
    return True


async def test_vox_web_allow_send_sends_through_the_console(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.kits.webkit import run_web

    procs, _ = fleet
    config = procs.operator_config
    await route_up(procs, "echo")
    monkeypatch.delenv("VOX_CONSOLE", raising=False)  # run_web's child goes through the console
    monkeypatch.setenv("VOX_CONSOLE_IDLE", "30")
    with run_web(config, tmp_path / "web.log", "--allow-send") as web:
        status, page = web.get("/")
        assert status == 200
        found = re.search(rb'name="vox-csrf" content="([0-9a-f]+)"', page)
        assert found is not None
        headers = {"content-type": "application/json", "x-csrf-token": found.group(1).decode()}
        body = json.dumps({"command": "echo", "params": {"text": "relayed"}}).encode()

        def offered() -> bool:
            _status, data = web.get("/api/commands")
            return "echo" in json.loads(data)["commands"]

        await until(offered, "the root's commands on the page", 60)
        status, data = web.request("POST", "/api/send", body=body, headers=headers)
        assert status == 200, data
        answer = json.loads(data)
        assert answer["ok"] is True, answer
        assert answer["result"] == "relayed", answer
        # A terminal's verb meanwhile shares the same console: nobody is kicked.
        sent = vox("send", "--config", config, "echo", "text=beside", "--json")
        assert sent.returncode == 0, sent.stderr
        log = web.log()
    assert "sending through the operator's console" in log, log
    stopped = vox("console", "stop", "--config", config)
    assert stopped.returncode == 0, stopped.stderr
    console_log = (state_dir_of(config) / "console.log").read_text()
    for text in (log, console_log, sent.stderr):
        for words in TAKEN_OVER:
            assert words not in text, text + procs.broker.log_text()[-6000:]


async def test_ctrl_c_on_a_follower_cancels_through_the_console(fleet: Fleet) -> None:
    procs, events_file = fleet
    config = procs.operator_config
    await route_up(procs, "stuck")
    follower = vox_process(
        "send", "--config", config, "stuck", "n=2", "--follow", "--timeout", "600",
        "--cancel-on-interrupt",
    )  # fmt: skip
    try:
        await until(lambda: event_at(events_file, "started", 2), "the handler to start", 60)
        # The follower is ready for Ctrl-C once it printed its request: its line is flushed
        # after the follower's SIGINT handler is in place (cli/follow.py). The handler may
        # start before that, on a loaded machine (the console sends the request first).
        assert follower.stdout is not None
        first = await asyncio.to_thread(follower.stdout.readline)
        assert first.startswith("request "), first
        follower.send_signal(signal.SIGINT)
        rest, err = await asyncio.to_thread(follower.communicate, timeout=60)
        out = first + rest
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    assert follower.returncode == 1, (out, err)
    assert "cancel: canceled" in out, out
    assert re.search(r" canceled CANCELED: ", out), out
    assert err.strip().splitlines()[-1].startswith("vox: error: stuck: CANCELED: "), err
    await until(lambda: event_at(events_file, "cancelled", 2), "the handler's cancel")
    # Timed for the report only (no bound asserted: docs/operations.md, "The operator's
    # console"): verbs answered from a running console.
    for verb in (("status", "--json"), ("warroom",), ("console", "status")):
        started = time.perf_counter()
        done = vox(*verb, "--config", config)
        print(f"vox {' '.join(verb)} through the console: {time.perf_counter() - started:.2f}s")
        assert done.returncode == 0, done.stderr
    inbox = vox("inbox", "--config", config, "--json", "--wait", "0")
    assert inbox.returncode == 0, inbox.stderr
    assert isinstance(json.loads(inbox.stdout), list)
    decided = vox("decide", "99", "approve", "--config", config)
    assert decided.returncode == 2, decided.stderr
    assert decided.stderr.startswith("vox: error: decide #99 approve: "), decided.stderr
    assert decided.stderr.count("\n") == 1, decided.stderr
    stopped = vox("console", "stop", "--config", config)
    assert stopped.returncode == 0, stopped.stderr
    log = (state_dir_of(config) / "console.log").read_text()
    for words in TAKEN_OVER:
        assert words not in out + err + log
