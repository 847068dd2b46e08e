"""Broker restarts under a fleet of three sites of 100 agents: no storm of false incidents.

The agents run in one worker process per broker (bench.fleet_worker, as the bench's
figures 9 and 16 run them), each a VOXAgent with its own identity, ledger and heartbeat;
the site masters on the core own their site's link (docs/federation.md). An independent
mosquitto_sub on the core records every war-room post. Bounds (docs/federation.md,
"Restarts and partitions"): after a core restart at most one SITE_LINK_LOST per site and
no incident about any agent behind a link; after a site restart one incident for that
site; all agents ACTIVE again within the documented bound; a command accepted before
the outage runs exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kits.brokerkit import Witness
from tests.kits.federationkit import Federation, running_federation
from tests.kits.fleetproc import REPO, child_env, wait_for_route
from vox_mqtt.broker.federation import bridge_id
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.observe.status import ACTIVE
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.sitelinks import SITE_LINK_LOST

pytestmark = pytest.mark.slow

SITES = 3
PER_SITE = 100
HEARTBEAT = 5.0
BRIDGE_KEEPALIVE = 5
# docs/federation.md: every agent back within reconnect spread + a heartbeat + slack.
BACK_BOUND = 90.0


def sites_fleet(tally: Path) -> str:
    """Root and site masters on the core; each site's 100 agents in a fan-out 10 tree."""
    from uuid import uuid4

    ids: dict[str, str] = {}
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n', '[[brokers]]\nname = "core"\n']
    parts += [f'[[brokers]]\nname = "site-{s}"\nupstream = "core"\n' for s in range(SITES)]

    def agent(name: str, master: str | None, broker: str, roles: tuple[str, ...] = ()) -> None:
        ids[name] = str(uuid4())
        lines = [f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"']
        lines.append(f"heartbeat_interval = {HEARTBEAT}")
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        lines.append(f'broker = "{broker}"')
        lines.append("roles = [" + ", ".join(f'"{r}"' for r in roles) + "]")
        if roles:
            lines.append(f'settings.tally_file = "{tally}"')
        parts.append("\n".join(lines) + "\n")

    agent("root", None, "core")
    for s in range(SITES):
        agent(f"master-{s}", "root", "core")
        for j in range(PER_SITE):
            above = f"master-{s}" if j < 10 else f"s{s}-a{(j - 10) // 10}"
            # One tally agent per site, a direct child of its master: commands cross.
            roles = (f"tests.kits.storm_roles:CountSite{s}",) if j == 0 else ()
            agent(f"s{s}-a{j}", above, f"site-{s}", roles)
    return "\n".join(parts)


@contextlib.contextmanager
def workers(fed: Federation) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Host every broker's agents in one process per broker; stop them all at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for broker, rendered in fed.dirs.items():
            names = [a.name for a in fed.fleet if (a.broker or "core") == broker]
            args = ["--fleet", str(fed.root / "fleet.toml"), "--broker-dir", str(rendered.root)]
            args += ["--port", str(rendered.port), "--state", str(fed.root / "agents")]
            args += ["--heartbeat", str(HEARTBEAT)]
            with (fed.root / f"worker-{broker}.log").open("wb") as log:
                started.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "bench.fleet_worker", *args, *names],
                        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                        cwd=REPO, env={**child_env(), "PYTHONPATH": str(REPO)},
                    )
                )  # fmt: skip
        for process in started:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith(b"ready"), (line, fed.root)
        yield started
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            if process.stdout is not None:
                process.stdout.close()


def agents_count(fed: Federation) -> int:
    return len(list(fed.fleet))


async def all_active(fed: Federation, timeout: float) -> float:
    """Wait until a fresh look on the core sees every agent ACTIVE; return the seconds."""
    started = time.monotonic()
    wanted = agents_count(fed)
    look = OperatorConsole(fed.operator_config, persistent=False, observe=(topics.STATUS_FILTER,))
    async with look:
        deadline = started + timeout
        while sum(a.status == ACTIVE for a in look.view.agents()) < wanted:
            if time.monotonic() > deadline:
                seen = sum(a.status == ACTIVE for a in look.view.agents())
                raise AssertionError(f"{seen} of {wanted} ACTIVE after {timeout} s")
            await asyncio.sleep(0.2)
    return time.monotonic() - started


def posts(witness: Witness) -> list[tuple[str, dict[str, Any]]]:
    """Return (topic, details) of every live war-room post (retained copies left out)."""
    out = []
    for line in list(witness.lines):
        retained, _, rest = line.partition(" ")
        topic, _, payload = rest.partition(" ")
        if retained == "0" and payload.startswith("{"):
            out.append((topic, json.loads(payload)["details"]))
    return out


def check_incidents(fed: Federation, witness: Witness, sites: list[str]) -> None:
    """At most one SITE_LINK_LOST per site (one for each site in sites), resolved; none else."""
    behind = {str(a.id) for a in fed.fleet if (a.broker or "core") != "core"}
    seen = posts(witness)
    for topic, details in seen:
        subject = topic.rsplit("/", 1)[-1]
        assert subject not in behind, f"an incident about an agent behind a link: {topic} {details}"
    for s in range(SITES):
        site = f"site-{s}"
        link = str(bridge_id(fed.fleet, site))
        opened = [
            d for t, d in seen
            if t.endswith(link) and d["error_code"] == SITE_LINK_LOST and not d.get("resolved")
        ]  # fmt: skip
        if site in sites:
            assert len(opened) == 1, (site, opened)
        else:
            assert len(opened) <= 1, (site, opened)
    stale = [d for _, d in seen if d["error_code"] != SITE_LINK_LOST and not d.get("resolved")]
    assert not stale, stale


def tally(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def send_tallies(fed: Federation, tag: int) -> list[asyncio.Future[Any]]:
    """Send one tally command per site from the operator; return the pending answers."""
    console = OperatorConsole(fed.operator_config, observe=[topics.STATUS_FILTER])
    await console.__aenter__()
    for s in range(SITES):
        await wait_for_route(console, f"count_site_{s}", timeout=60)
    pending = [
        asyncio.ensure_future(
            console.send_command(f"count_site_{s}", {"tag": f"{tag + s}"}, wait=240)
        )
        for s in range(SITES)
    ]
    pending.append(asyncio.ensure_future(_close_after(console, pending)))
    return pending


async def _close_after(console: OperatorConsole, pending: list[asyncio.Future[Any]]) -> None:
    try:
        await asyncio.gather(*pending[:SITES])
    finally:
        await console.__aexit__(None, None, None)


# Open (docs/federation.md, "Restarts and partitions"): after a core restart Mosquitto
# publishes each restored session's will when its client takes the session over, so a
# core agent's master may post VM_CONNECTION_LOST for it; and a master that hears no
# child for 3 heartbeats (core down, then the bridge's backoff) counts each one stale.
# The rules that decide both live in agent/liveness.py. The test runs and reports.
STORM_OPEN = pytest.mark.xfail(
    reason="false incidents after a core restart: wills on session takeover, stale children",
    strict=False,
)


@STORM_OPEN
@pytest.mark.timeout(900)  # 304 agents start in about a minute on the 2-core VM
def test_a_core_restart_gives_one_incident_per_site_at_most(tmp_path: Path) -> None:
    tally_file = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", sites_fleet(tally_file), bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        asyncio.run(all_active(fed, 240))
        witness = Witness(fed.creds("core", "explorer"), "vox/warroom/#", fmt="%r %t %p")
        try:

            async def scenario() -> float:
                pending = await send_tallies(fed, 100)
                await asyncio.sleep(0.5)
                fed.brokers["core"].stop()
                await asyncio.sleep(2.0)
                started = time.monotonic()
                fed.brokers["core"].start()
                await all_active(fed, BACK_BOUND)
                back = time.monotonic() - started
                await asyncio.wait_for(asyncio.gather(*pending), 240)
                # Quiet for two heartbeats: no late incident for anyone.
                await asyncio.sleep(2 * HEARTBEAT)
                return back

            back = asyncio.run(scenario())
            print(f"core restart: every agent ACTIVE again after {back:.1f} s")
            check_incidents(fed, witness, sites=[])
        finally:
            witness.close()
    assert sorted(tally(tally_file)) == sorted(str(100 + s) for s in range(SITES))


@STORM_OPEN
@pytest.mark.timeout(900)
def test_a_site_restart_gives_one_incident_for_the_site(tmp_path: Path) -> None:
    tally_file = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", sites_fleet(tally_file), bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        asyncio.run(all_active(fed, 240))
        witness = Witness(fed.creds("core", "explorer"), "vox/warroom/#", fmt="%r %t %p")
        try:

            async def scenario() -> float:
                pending = await send_tallies(fed, 200)
                await asyncio.sleep(0.5)
                fed.brokers["site-1"].stop()
                await asyncio.sleep(2.0)
                started = time.monotonic()
                fed.brokers["site-1"].start()
                await all_active(fed, BACK_BOUND)
                back = time.monotonic() - started
                await asyncio.wait_for(asyncio.gather(*pending), 240)
                await asyncio.sleep(2 * HEARTBEAT)
                return back

            back = asyncio.run(scenario())
            print(f"site restart: every agent ACTIVE again after {back:.1f} s")
            check_incidents(fed, witness, sites=["site-1"])
        finally:
            witness.close()
    assert sorted(tally(tally_file)) == sorted(str(200 + s) for s in range(SITES))


def test_fleet_shape() -> None:
    """The fleet these tests run is what they say: 3 sites of 100, masters on the core."""
    text = sites_fleet(Path(os.devnull))
    assert text.count("[[agents]]") == 1 + SITES * (1 + PER_SITE)
