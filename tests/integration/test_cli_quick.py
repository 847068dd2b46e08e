"""The verbs through a running console: what they load, and what they say while they wait.

operator -> root -> coordinator -> specialist (tests/kits/lifecyclekit.py), one `vox console
serve`. `vox status`, `warroom`, `inbox` and `request show` answered by the console load no
MQTT, pydantic, SQLite driver or agent runtime, and `vox --help` no verb module at all
(docs/architecture.md, "The command line"). With the root stopped, `vox send` says at once
that the root is down, from the console's live view, and a verb whose answer is late says
what it waits for (docs/operations.md, "The operator's console"). How fast each verb
answers is a bench figure (bench/verb_speed.py), not a test.

These verbs run without the suite's VOX_CONSOLE=one-shot (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, serving_vox
from tests.kits.lifecyclekit import lifecycle_fleet, route_up, until
from vox_mqtt.cli import VERBS

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]
# What a verb answered by the console has no need of.
HEAVY = (
    "paho",
    "aiomqtt",
    "pydantic",
    "aiosqlite",
    "vox_mqtt.agent",
    "vox_mqtt.transport",
    "vox_mqtt.ledger.store",
    "vox_mqtt.observe.observer",
    "vox_mqtt.console.operator",
)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path / "fleet") as found:
        yield found


def client_env() -> dict[str, str]:
    """A verb's environment: through the console (the suite's one-shot default dropped)."""
    env = child_env()
    env.pop("VOX_CONSOLE", None)
    env["COLUMNS"] = "160"
    return env


def vox(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
        capture_output=True, text=True, env=client_env(), cwd=REPO, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


_LOADED = """\
import sys
from vox_mqtt.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
print("exit", code, file=sys.stderr)
"""


def loaded(*args: str | Path) -> tuple[str, set[str], str]:
    """Run `vox ARGS` in a child; return its output, the modules it loaded, its exit line."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *map(str, args)],
        capture_output=True, text=True, env=client_env(), cwd=REPO, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert lines, done.stderr[-3000:]
    assert lines[-1].startswith("exit"), done.stderr[-3000:]
    return done.stdout, set(lines[:-1]), lines[-1]


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(HEAVY))


def console_ready(log: str) -> str | None:
    return "" if "listening on" in log else None


async def test_verbs_through_a_console_load_little_and_say_what_they_wait_for(
    fleet: Fleet, tmp_path: Path
) -> None:
    procs, _events = fleet
    config = procs.operator_config
    await route_up(procs, "echo")
    _, modules, code = loaded("--help")
    assert code == "exit 0"
    assert not {f"vox_mqtt.cli.{module}" for _, module, _ in VERBS} & modules
    assert heavy(modules) == []

    serve = ["console", "serve", "--config", str(config)]
    with serving_vox(serve, tmp_path / "console.log", console_ready, "vox console serve"):
        sent = vox("send", "--config", config, "echo", "text=hi", "--detach", "--json")
        assert sent.returncode == 0, sent.stderr
        request_id = json.loads(sent.stdout)["request_id"]

        await until(lambda: vox("status", "--config", config, "--json").returncode == 0, "status")
        for verb in (
            ("status",),
            ("status", "--json"),
            ("warroom",),
            ("inbox", "--wait", "0"),
            ("request", "show", request_id[:8]),
        ):
            out, modules, code = loaded(*verb, "--config", config)
            assert code == "exit 0", (verb, out)
            assert heavy(modules) == [], verb
        out, _, _ = loaded("request", "show", request_id, "--config", config)
        assert f"request {request_id}" in out, out
        out, _, _ = loaded("status", "--config", config)
        assert "specialist" in out, out

        # The root stops: the console's live view sees it INACTIVE (its will, then its
        # status), and says so to the next `vox send` at once.
        procs.agents["root"].stop()

        def root_down() -> bool:
            done = vox("status", "--config", config, "--json")
            agents = json.loads(done.stdout).get("agents", []) if done.returncode == 0 else []
            return any(a.get("name") == "root" and a.get("status") == "INACTIVE" for a in agents)

        await until(root_down, "the console's view to see the root down", 60)
        down = vox("send", "--config", config, "echo", "text=late", "--timeout", "4")
        print(down.stderr)  # what the person sees (docs/operations.md shows it)
        assert down.returncode == 1, (down.stdout, down.stderr)
        lines = down.stderr.splitlines()
        said = [i for i, line in enumerate(lines) if "the root (root) is INACTIVE" in line]
        assert said, down.stderr
        waiting = [i for i, line in enumerate(lines) if "waiting for the root's answer" in line]
        assert waiting, down.stderr
        assert said[0] < waiting[0] < len(lines) - 1, down.stderr  # both before the end
        assert lines[-1].startswith("vox: error: echo: "), down.stderr

        # A question the root cannot answer now: the verb says what it waits for, then ends.
        show = vox("request", "show", request_id, "--config", config, "--wait", "3")
        assert f"vox: waiting for the root's answer about request {request_id}" in show.stderr, (
            show.stdout,
            show.stderr,
        )
