"""Cut bridges for real: a black-holed link and a stopped site broker, then healing.

Bound (docs/federation.md): a cut shows on the core within 2.5 x the bridge keepalive
(5 s here): the upstream broker publishes the bridge's will 1.5 keepalives after the
last packet, on its next periodic keepalive check; the owner's one SITE_LINK_LOST
incident follows within its next reconcile tick. A stopped site broker says so at
once. Commands accepted meanwhile are answered after healing, exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kits.brokerkit import Witness
from tests.kits.faultkit import run_vox
from tests.kits.federationkit import Federation, federated_fleet_text, running_federation
from tests.kits.fleetproc import wait_for_route
from vox_mqtt.broker.federation import bridge_id, link_topic
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.sitelinks import SITE_LINK_LOST, UNREACHABLE

pytestmark = pytest.mark.slow

BRIDGE_KEEPALIVE = 5
# A link's loss must be known before its agents' heartbeats go stale (3 x 5 s here),
# else their masters see them lost one by one first (docs/federation.md).
HEARTBEAT = 5.0
BOUND = 2.5 * BRIDGE_KEEPALIVE + 3.0  # the will, plus scheduling slack on a loaded machine
EAST = ("tests.kits.federation_roles:TallyEast",)
WEST = ("tests.kits.federation_roles:TallyWest",)


def _fleet(tally: Path) -> str:
    return federated_fleet_text(
        {
            "root": (None, None, ()),
            "coord_e": ("root", "east", ()),
            "spec_e": ("coord_e", None, EAST),
            "coord_w": ("root", "west", ()),
            "spec_w": ("coord_w", None, WEST),
        },
        {"core": None, "east": "core", "west": "core"},
        heartbeat=HEARTBEAT,
        settings={name: {"tally_file": str(tally)} for name in ("spec_e", "spec_w")},
    )


def _status(fed: Federation) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    out = run_vox("status", "--config", fed.operator_config, "--json", "--wait", "2")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    agents = {entry["name"]: entry for entry in document["agents"]}
    links = {row["site"]: row["state"] for row in document.get("links", [])}
    return agents, links


def _posts(warroom: Witness) -> list[tuple[str, dict[str, Any]]]:
    """Return (topic, details) of every war-room post the witness saw (clears left out)."""
    posts = []
    for line in list(warroom.lines):
        topic, _, payload = line.partition(" ")
        if topic.startswith("vox/warroom/") and payload.startswith("{"):
            posts.append((topic, json.loads(payload)["details"]))
    return posts


def _check_incidents(fed: Federation, warroom: Witness) -> None:
    """One SITE_LINK_LOST incident per lost site, resolved; no incident per agent behind it."""
    root = fed.id("root")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        resolved = [
            d for _, d in _posts(warroom) if d["error_code"] == SITE_LINK_LOST and d["resolved"]
        ]
        if len(resolved) >= 2:
            break
        time.sleep(0.2)
    posts = _posts(warroom)
    print("\n".join(f"{t} {d['error_code']} resolved={d['resolved']}" for t, d in posts))
    for site in ("east", "west"):
        topic = f"vox/warroom/{root}/{bridge_id(fed.fleet, site)}"
        about = [d for t, d in posts if t == topic]
        assert [d["resolved"] for d in about] == [False, True], (site, about)
        assert all(d["error_code"] == SITE_LINK_LOST for d in about)
    behind = {str(fed.id(n)) for n in ("coord_e", "spec_e", "coord_w", "spec_w")}
    per_agent = [(t, d) for t, d in posts if t.startswith(f"vox/warroom/{root}/") and
                 t.rsplit("/", 1)[1] in behind]  # fmt: skip
    assert per_agent == [], per_agent


def _wait_prefix(witness: Witness, prefix: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.startswith(prefix) for line in list(witness.lines)):
            return True
        time.sleep(0.05)
    return False


def _wait_count(witness: Witness, line: str, count: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(witness.lines).count(line) >= count:
            return True
        time.sleep(0.1)
    return False


def _tally(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_cut_link_and_a_stopped_site_lose_nothing_and_run_nothing_twice(
    tmp_path: Path,
) -> None:
    tally = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", _fleet(tally), proxied=["east"], bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed:
        fed.start()
        # One independent witness on the core (the explorer reads vox/#; its own client id,
        # so it never takes over the operator's session).
        links = warroom = Witness(fed.creds("core", "explorer"), "vox/#")
        east_link = link_topic(bridge_id(fed.fleet, "east"))
        west_link = link_topic(bridge_id(fed.fleet, "west"))
        try:
            answered = asyncio.run(_scenario(fed, links, east_link, west_link))
            _check_incidents(fed, warroom)
        finally:
            links.close()
    tags = _tally(tally)
    # Every accepted command ran exactly once, across both outages.
    assert sorted(tags) == sorted(set(tags)), tags
    assert {t for t in tags if t.startswith("east-")} == {f"east-{i}" for i in range(4)}
    assert {t for t in tags if t.startswith("west-")} == {"west-0", *answered, "west-3"}


async def _accepted_or_refused(console: OperatorConsole, command: str, tag: str) -> str | None:
    """Return the tag once answered, or None when the root refused it at once.

    The root refuses work for an agent it sees down as TARGET_INACTIVE (docs/liveness.md).
    """
    try:
        reply = await console.send_command(command, {"tag": tag}, wait=90)
    except CommandFailed as exc:
        refused = exc
    else:
        assert reply.details["result"]["tag"] == tag
        return tag
    assert refused.code == "TARGET_INACTIVE", refused
    return None


async def _scenario(fed: Federation, links: Witness, east_link: str, west_link: str) -> list[str]:
    """Cut east, then stop west; return the west tags accepted and answered meanwhile."""
    async with OperatorConsole(fed.operator_config, observe=[topics.STATUS_FILTER]) as console:
        await wait_for_route(console, "count_east", timeout=60)
        await wait_for_route(console, "count_west", timeout=60)
        reply = await console.send_command("count_east", {"tag": "east-0"}, wait=30)
        assert reply.details["result"]["by"] == "spec_e"
        assert links.wait_line(f"{east_link} 1", 10)

        # 1. A cable cut (no FIN, no RST) between the east site and the core.
        cut = time.monotonic()
        fed.proxies["east"].blackhole()
        pending = [
            asyncio.ensure_future(console.send_command("count_east", {"tag": f"east-{i}"}, wait=90))
            for i in (1, 2, 3)
        ]
        assert await asyncio.to_thread(links.wait_line, f"{east_link} 0", BOUND + 5)
        detected = time.monotonic() - cut
        print(f"east link loss seen on the core after {detected:.1f}s")
        assert detected <= BOUND, f"link loss seen after {detected:.1f}s"
        # The one incident follows within the root's next reconcile tick (at most 1 s).
        incident = f"vox/warroom/{fed.id('root')}/{bridge_id(fed.fleet, 'east')} "
        assert await asyncio.to_thread(_wait_prefix, links, incident, 5)
        posted = time.monotonic() - cut
        print(f"east SITE_LINK_LOST incident posted {posted:.1f}s after the cut")
        assert posted <= BOUND + 1.5
        agents, states = await asyncio.to_thread(_status, fed)
        assert states["east"] == "DOWN"
        assert states["west"] == "UP"
        for name in ("coord_e", "spec_e"):
            assert agents[name]["status"] == UNREACHABLE, agents[name]
            assert agents[name]["error_code"] == SITE_LINK_LOST
        assert agents["coord_w"]["status"] == "ACTIVE"
        # The other site is not affected meanwhile.
        other = await console.send_command("count_west", {"tag": "west-0"}, wait=30)
        assert other.details["result"]["by"] == "spec_w"
        assert not any(task.done() for task in pending)
        # Inside the cut-off site life goes on: past 3 heartbeats the root has seen coord_e
        # go quiet, while coord_e kept hearing spec_e on their own broker.
        await asyncio.sleep(max(0.0, cut + 3 * HEARTBEAT + 3 - time.monotonic()))
        assert "coord_e ACTIVE -> STALE" in fed.daemons["root"].log()
        assert "spec_e ACTIVE -> STALE" not in fed.daemons["coord_e"].log()
        fed.proxies["east"].heal()
        results = await asyncio.gather(*pending)
        assert sorted(r.details["result"]["tag"] for r in results) == ["east-1", "east-2", "east-3"]
        assert await asyncio.to_thread(links.wait_line, f"{east_link} 1", 30)
        healed, _ = await asyncio.to_thread(_status, fed)
        assert healed["spec_e"]["status"] == "ACTIVE"

        # 2. The west site's broker stops (a site power cut), then comes back.
        stopped = time.monotonic()
        fed.brokers["west"].stop()
        # Stopping, it published its clients' wills before its bridge went: the root now
        # sees coord_w INACTIVE and may refuse new work for it (TARGET_INACTIVE) until it is
        # back.
        waiting = [
            asyncio.ensure_future(_accepted_or_refused(console, "count_west", f"west-{i}"))
            for i in (1, 2)
        ]
        assert await asyncio.to_thread(links.wait_line, f"{west_link} 0", BOUND + 5)
        assert time.monotonic() - stopped <= BOUND
        agents, states = await asyncio.to_thread(_status, fed)
        assert states["west"] == "DOWN"
        assert agents["spec_w"]["error_code"] == SITE_LINK_LOST
        await asyncio.sleep(2)
        fed.brokers["west"].start()
        outcomes = await asyncio.gather(*waiting)
        answered = sorted(tag for tag in outcomes if tag is not None)
        # Every command the root accepted was answered after the site came back.
        # Up, down, up again: the second "1" is the healed link.
        assert await asyncio.to_thread(_wait_count, links, f"{west_link} 1", 2, 30)
        await wait_for_route(console, "count_west", timeout=60)
        after = await console.send_command("count_west", {"tag": "west-3"}, wait=60)
        assert after.details["result"]["by"] == "spec_w"
        return answered
