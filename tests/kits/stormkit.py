"""Three sites of 100 agents in worker processes, bridged to a core, for the storm tests.

What tests/integration/test_site_storms.py and test_site_partition.py share (docs/federation.md,
"Restarts and partitions").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

from tests.kits.brokerkit import Witness
from tests.kits.faultkit import TcpProxy
from tests.kits.federationkit import Federation
from tests.kits.fleetproc import REPO, child_env, wait_for_route
from vox_mqtt.broker.federation import bridge_id, bridge_restart
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.cli.looks import load_reader, observing
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.observe.status import ACTIVE, AgentLiveness, FleetView
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.hierarchy import Fleet
from vox_mqtt.protocol.sitelinks import SITE_LINK_LOST
from vox_mqtt.protocol.storm import reconnect_cap, reconnect_spread

SITES = 3
PER_SITE = 100
HEARTBEAT = 5.0
BRIDGE_KEEPALIVE = 5
# How long the broker stays down: a quick restart, so that the broker's agents come back
# within about one spread, all at once: the burst in which, without storm control, the
# masters of a restarted site posted their children's wills (sent as the broker stopped).
DOWN = 1.0


def sites_fleet(tally: Path, *, sites: int = SITES, per_site: int = PER_SITE) -> str:
    """Root and site masters on the core; each site's agents (100) in a fan-out 10 tree."""
    from uuid import uuid4

    ids: dict[str, str] = {}
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n', '[[brokers]]\nname = "core"\n']
    parts += [f'[[brokers]]\nname = "site-{s}"\nupstream = "core"\n' for s in range(sites)]

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
    for s in range(sites):
        agent(f"master-{s}", "root", "core")
        for j in range(per_site):
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


# How long the test's own look may take to be let in (seconds); see look().
LOOK_CONNECT = 30.0


def agents_count(fed: Federation) -> int:
    return len(list(fed.fleet))


@contextlib.asynccontextmanager
async def look(fed: Federation) -> AsyncIterator[FleetView]:
    """A fresh look on the core, as `vox status` takes it: the operator's status look
    identity, no session, no ledger. (A console of the operator's own identity would take
    the operator's session over, since the brokers lock client ids: docs/broker.md.)"""
    reader = load_reader(fed.operator_config, "status")
    # The look is this test's instrument, not what it judges: a core busy taking 304
    # agents' connections on a loaded machine may take more than a look's usual 5 s to
    # let one more in (seen once: "not connected within 5s" while agents started).
    reader = replace(reader, broker=replace(reader.broker, connect_timeout=LOOK_CONNECT))
    async with observing(reader, warroom=False) as seen:
        yield seen.view


async def epochs(fed: Federation, timeout: float) -> dict[UUID, int]:
    """Wait until a fresh look on the core sees every agent ACTIVE; return their epochs."""
    wanted = agents_count(fed)
    async with look(fed) as view, asyncio.timeout(timeout):
        while sum(a.status == ACTIVE for a in view.agents()) < wanted:  # noqa: ASYNC110 - the view is polled
            await asyncio.sleep(0.2)
        return {a.id: a.epoch for a in view.agents()}


async def all_back(
    fed: Federation, before: dict[UUID, int], reconnected: set[UUID], timeout: float
) -> float:
    """Wait until a look on the core has every agent's live ACTIVE heartbeat; return seconds.

    A retained ACTIVE restored by a restarted broker is the old session's word, not proof
    of life: each agent counts once a live status of it arrived, and one that reconnected
    (it lives on the restarted broker) once that status carries a newer epoch.
    """
    started = time.monotonic()

    def back(entry: AgentLiveness) -> bool:
        newer = entry.id not in reconnected or entry.epoch > before[entry.id]
        return entry.status == ACTIVE and not entry.retained and newer

    async with look(fed) as view:
        deadline = started + timeout
        while sum(back(a) for a in view.agents()) < len(before):
            if time.monotonic() > deadline:
                late = sorted(a.name for a in view.agents() if not back(a))
                raise AssertionError(f"not back after {timeout} s: {late[:10]} ({len(late)})")
            await asyncio.sleep(0.2)
    return time.monotonic() - started


def war_room_witness(fed: Federation) -> Witness:
    """Return a witness of every war-room post on the core, through restarts (its session
    is kept on the broker, so what is posted while it reconnects is queued for it)."""
    return witness_on(fed.creds("core", "explorer"), fed.brokers["core"])


def witness_on(creds: Credentials, broker: LocalBroker) -> Witness:
    """Return a war-room witness logged in with creds on broker, once the broker saw it."""
    witness = Witness(creds, "vox/warroom/#", fmt="%r %t %p", session_expiry=600)
    deadline = time.monotonic() + 20
    while f"as {creds.username} " not in broker.log_text():
        assert time.monotonic() < deadline, "the war-room witness did not connect"
        time.sleep(0.1)
    return witness


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
    """One SITE_LINK_LOST for each site in sites, at most one for the others, each resolved;
    no incident about any agent, behind a link or on the core."""
    seen = posts(witness)
    kinds = Counter(d["error_code"] + (" resolved" if d.get("resolved") else "") for _, d in seen)
    print(f"war room: {len(seen)} posts {dict(kinds)}")
    summary = incident_summary(fed.fleet, seen, SITES)
    about_agents = summary["about_agents"]
    assert not about_agents, f"incidents about agents: {about_agents[:5]} ({len(about_agents)})"
    for site, (opened, resolved) in summary["site_links"].items():
        assert opened == (1 if site in sites else opened) <= 1, (site, opened)
        assert resolved == opened, (site, "every SITE_LINK_LOST resolved", seen)


def incident_summary(
    fleet: Fleet, seen: list[tuple[str, dict[str, Any]]], sites: int
) -> dict[str, Any]:
    """Sort war-room posts: those about agents, and per site its SITE_LINK_LOST posts
    (opened, resolved)."""
    links = {str(bridge_id(fleet, f"site-{s}")): f"site-{s}" for s in range(sites)}
    about_agents = [(t, d) for t, d in seen if t.rsplit("/", 1)[-1] not in links]
    site_links = {}
    for link, site in links.items():
        mine = [d for t, d in seen if t.endswith(link)]
        opened = [d for d in mine if d["error_code"] == SITE_LINK_LOST and not d.get("resolved")]
        site_links[site] = (len(opened), sum(bool(d.get("resolved")) for d in mine))
    return {"about_agents": about_agents, "site_links": site_links}


def tally(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def send_tallies(fed: Federation, tag: int) -> list[asyncio.Future[Any]]:
    """Send one tally command per site from the operator; return the pending answers."""
    console = OperatorConsole(fed.operator_config, observe=[topics.STATUS_FILTER])
    await console.__aenter__()
    for s in range(SITES):
        await wait_for_route(console, f"count_site_{s}", timeout=60)
    pending: list[asyncio.Future[Any]] = [
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


def restart(fed: Federation, broker: str, tag: int) -> float:
    """Restart one broker under the fleet with commands in flight; return the time to all back.

    Then stay quiet for two heartbeats, so that a late incident would be seen too.
    """
    before = asyncio.run(epochs(fed, 60))
    reconnected = {a.id for a in fed.fleet if (a.broker or "core") == broker}

    async def scenario() -> float:
        pending = await send_tallies(fed, tag)
        await asyncio.sleep(0.5)
        fed.brokers[broker].stop()
        await asyncio.sleep(DOWN)
        fed.brokers[broker].start()
        back = await all_back(fed, before, reconnected, back_bound(fed, broker))
        await asyncio.wait_for(asyncio.gather(*pending), 120)
        await asyncio.sleep(2 * HEARTBEAT)
        return back

    return asyncio.run(scenario())


def back_bound(fed: Federation, broker: str) -> float:
    """docs/federation.md: the restarted broker's agents try again within their backoff
    window (never over the cap), the bridges within their restart_timeout cap, and each
    agent's next heartbeat crosses after that; plus slack for the look's own connect on a
    loaded machine."""
    spread = reconnect_spread(sum((a.broker or "core") == broker for a in fed.fleet))
    _, bridge_cap = bridge_restart(fed.fleet, "site-0")
    return reconnect_cap(spread) + bridge_cap + HEARTBEAT + 10.0


PARTITION = 60.0  # issue #27, item 4: one site cut from the core for 60 s under load


async def partition_under_load(fed: Federation, site: int) -> dict[str, str]:
    """Cut one site's bridge (no FIN) for PARTITION s while each site gets a command a
    second; heal; return {tag: the answer's tag, or the error code} of every command."""
    return await cut_under_load(fed.operator_config, fed.proxies[f"site-{site}"], SITES)


async def cut_under_load(
    operator_config: Path, proxy: TcpProxy, sites: int, seconds: float = PARTITION
) -> dict[str, str]:
    """Black-hole proxy (a site's bridge) for seconds while the operator sends each of the
    sites' `count_site_N` a command a second; heal; return {tag: answer's tag or error code}."""
    async with OperatorConsole(operator_config, observe=[topics.STATUS_FILTER]) as console:
        for s in range(sites):
            await wait_for_route(console, f"count_site_{s}", timeout=60)
        pending: dict[str, asyncio.Future[Any]] = {}
        proxy.blackhole()
        cut = time.monotonic()
        second = 0
        while time.monotonic() - cut < seconds:
            for s in range(sites):
                command = console.send_command(
                    f"count_site_{s}", {"tag": f"p{s}-{second}"}, wait=240
                )
                pending[f"p{s}-{second}"] = asyncio.ensure_future(command)
            second += 1
            await asyncio.sleep(max(0.0, cut + second - time.monotonic()))
        proxy.heal()
        replies = await asyncio.wait_for(
            asyncio.gather(*pending.values(), return_exceptions=True), 240
        )
    out = {}
    for tag, reply in zip(pending, replies, strict=True):
        if isinstance(reply, CommandFailed):
            out[tag] = reply.code
        elif isinstance(reply, BaseException):
            raise reply
        else:
            out[tag] = str(reply.details["result"]["tag"])
    return out
