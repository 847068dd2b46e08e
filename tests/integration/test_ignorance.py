"""Ignorance enforced by the broker, on real daemons in a four-level tree (docs/broker.md).

A specialist must learn nothing of the root, nor of its siblings; a coordinator nothing of
its master's master, nor of its master's other children: no id, no name, no command name.
Searched: everything the broker delivers to the identity (a `mosquitto_sub` witness logged
in as it on `#`), its bundle (its config file and the files beside it named for it), its
state dir (ledger, names, incidents) and its view of the fleet (`vox status --config`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kits.faultkit import Deployment, Processes, deploy_fleet, run_vox
from tests.kits.recorder import Recorder, Seen
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics

pytestmark = pytest.mark.slow

ANALYST = "tests.kits.agentkit:Analyst"
NUMBERS = "tests.kits.roles_for_tests:Numbers"
SLEEPER = "tests.kits.roles_for_tests:Sleeper"

# apex -> middle -> lead -> (spec_a: analyze, spec_b: numbers); middle -> sidekick (wedge ...).
TREE: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "apex": (None, ()),
    "middle": ("apex", ()),
    "lead": ("middle", ()),
    "sidekick": ("middle", (SLEEPER,)),
    "spec_a": ("lead", (ANALYST,)),
    "spec_b": ("lead", (NUMBERS,)),
}
EVERYTHING = ["analyze", "echo", "numbers", "slow", "wedge"]


def _witness(dep: Deployment, name: str) -> subprocess.Popen[bytes]:
    """Log in as the agent (another client id) and print every message it may receive."""
    creds = dep.broker_dir.credentials_for(name)
    with (dep.root / f"witness-{name}.txt").open("wb") as out:  # the child keeps its copy
        return subprocess.Popen(
            [
                *("mosquitto_sub", "-h", "127.0.0.1", "-p", str(dep.port), "-V", "5", "-q", "1"),
                *(
                    "-u",
                    creds.username,
                    "-P",
                    creds.password or "",
                    "-i",
                    f"{creds.username}-witness",
                ),
                *("-t", "#", "-F", "%t %P %p"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _forbidden(dep: Deployment, names: list[str], commands: list[str]) -> list[str]:
    return [*names, *(str(dep.id(n)) for n in names), *commands]


def _found(blob: bytes, needles: list[str]) -> list[str]:
    lowered = blob.lower()
    return [n for n in needles if n.lower().encode() in lowered]


def _files(*paths: Path) -> bytes:
    out = b""
    for path in paths:
        for item in [path] if path.is_file() else sorted(path.rglob("*")):
            if item.is_file():
                out += item.read_bytes()
    return out


def _send(dep: Deployment, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Send commands as the operator (one console, in this process) and wait for each answer."""

    async def send() -> None:
        async with OperatorConsole(dep.operator_config) as console:
            for command, params in calls:
                answer = await console.send_command(command, params, wait=20)
                assert answer.type == "command_result", answer

    asyncio.run(send())


def _advertised(rec: Recorder, dep: Deployment, want: list[str], after: float) -> None:
    """Wait until the root's status advertises exactly these commands (after `after`)."""
    topic = topics.status(dep.id("apex"))

    def matches(item: Seen) -> bool:
        return item.topic == topic and sorted(item.json()["details"]["commands"]) == want

    rec.wait(matches, after=after, timeout=30, what=f"the root advertising {want}")


def test_a_specialist_and_a_coordinator_learn_nothing_above_their_master(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], processes: Processes
) -> None:
    # Witnesses log in as agents beside their daemons: client ids left unlocked.
    dep = deploy_fleet(tmp_path, TREE, heartbeat=0.5, keepalive=5, lock_client_ids=False)
    broker_factory(dep.conf_text(), port=dep.port)
    witnesses = {name: _witness(dep, name) for name in ("spec_a", "lead")}
    try:
        with dep.recorder() as rec:
            processes.start(dep)
            _advertised(rec, dep, EVERYTHING, 0.0)
            # Work through every branch: each answer passes the lead and the middle.
            _send(dep, [("analyze", {"target": "hello"}), ("numbers", {"count": 2}), ("echo", {})])
            # The lead's sibling dies and comes back: its will, the middle's new advertisement.
            killed = time.monotonic()
            processes["sidekick"].signal(signal.SIGKILL)
            _advertised(rec, dep, ["analyze", "numbers"], killed)
            reborn = time.monotonic()
            processes["sidekick"].start()
            _advertised(rec, dep, EVERYTHING, reborn)
            _send(dep, [("analyze", {"target": "again"})])
        views = {
            name: run_vox("status", "--config", dep.configs[name], "--json", "--wait", "2")
            for name in ("spec_a", "lead")
        }
    finally:
        seen: dict[str, bytes] = {}
        for name, witness in witnesses.items():
            witness.terminate()
            witness.wait(10)
            seen[name] = (dep.root / f"witness-{name}.txt").read_bytes()
    for view in views.values():
        assert view.returncode == 0, view.stderr

    # The witnesses saw real traffic: their master's presence and their own inbox.
    assert f"vox/{dep.id('lead')}/presence".encode() in seen["spec_a"]
    assert f"vox/{dep.id('spec_a')}/inbox/{dep.id('lead')}".encode() in seen["spec_a"]
    assert f"vox/{dep.id('middle')}/presence".encode() in seen["lead"]
    assert f"vox/{dep.id('spec_a')}/status".encode() in seen["lead"]

    etc = dep.configs["spec_a"].parent
    looks = {
        "spec_a": _forbidden(dep, ["apex", "middle", "spec_b", "sidekick"], ["numbers", "wedge"]),
        # The lead knows its own children, never what is above its master or beside it.
        "lead": _forbidden(dep, ["apex", "sidekick"], ["wedge", "echo"]),
    }
    for name, needles in looks.items():
        bundle = _files(*sorted(etc.glob(f"{name}.*")), *sorted(etc.glob(f"{name}-*")))
        state = _files(dep.state_dir(name))
        where = {
            "on the wire": seen[name],
            "in its bundle": bundle,
            "in its state dir": state,
            "in its view": views[name].stdout.encode(),
        }
        assert bundle
        assert state
        leaks = {place: _found(blob, needles) for place, blob in where.items()}
        assert leaks == {place: [] for place in where}, name
