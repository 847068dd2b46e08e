"""Cut bridges for real: a black-holed link and a stopped site broker, then healing.

Bound (docs/federation.md): a cut shows on the core within 2.5 x the bridge keepalive
(5 s here): the upstream broker publishes the bridge's will 1.5 keepalives after the
last packet, on its next periodic keepalive check. A stopped site broker says so at
once. Commands accepted meanwhile are answered after healing, exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.brokerkit import Witness
from tests.faultkit import run_vox
from tests.federationkit import Federation, federated_fleet_text, running_federation
from tests.test_fleet_processes import wait_for_route
from vox_mqtt.console import ALL_STATUS, OperatorConsole
from vox_mqtt.federation import bridge_id, link_topic
from vox_mqtt.sitelinks import SITE_LINK_LOST, UNREACHABLE

pytestmark = pytest.mark.slow

BRIDGE_KEEPALIVE = 5
BOUND = 2.5 * BRIDGE_KEEPALIVE + 3.0  # the will, plus scheduling slack on a loaded machine
EAST = ("tests.federation_roles:TallyEast",)
WEST = ("tests.federation_roles:TallyWest",)


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
        heartbeat=5.0,
        settings={name: {"tally_file": str(tally)} for name in ("spec_e", "spec_w")},
    )


def _status(fed: Federation) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    out = run_vox("status", "--config", fed.operator_config, "--json", "--wait", "2")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    agents = {entry["name"]: entry for entry in document["agents"]}
    links = {row["site"]: row["state"] for row in document.get("links", [])}
    return agents, links


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
        links = Witness(fed.creds("core", "operator"), "vox/link/+")
        east_link = link_topic(bridge_id(fed.fleet, "east"))
        west_link = link_topic(bridge_id(fed.fleet, "west"))
        try:
            asyncio.run(_scenario(fed, links, east_link, west_link))
        finally:
            links.close()
    tags = _tally(tally)
    # Every accepted command ran exactly once, across both outages.
    assert sorted(tags) == sorted(set(tags)), tags
    assert {t for t in tags if t.startswith("east-")} == {f"east-{i}" for i in range(4)}
    assert {t for t in tags if t.startswith("west-")} == {f"west-{i}" for i in range(3)}


async def _scenario(fed: Federation, links: Witness, east_link: str, west_link: str) -> None:
    async with OperatorConsole(fed.operator_config, observe=[ALL_STATUS]) as console:
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
        fed.proxies["east"].heal()
        results = await asyncio.gather(*pending)
        assert sorted(r.details["result"]["tag"] for r in results) == ["east-1", "east-2", "east-3"]
        assert await asyncio.to_thread(links.wait_line, f"{east_link} 1", 30)
        healed, _ = await asyncio.to_thread(_status, fed)
        assert healed["spec_e"]["status"] == "ACTIVE"

        # 2. The west site's broker stops (a site power cut), then comes back.
        stopped = time.monotonic()
        fed.brokers["west"].stop()
        waiting = [
            asyncio.ensure_future(console.send_command("count_west", {"tag": f"west-{i}"}, wait=90))
            for i in (1, 2)
        ]
        assert await asyncio.to_thread(links.wait_line, f"{west_link} 0", BOUND + 5)
        assert time.monotonic() - stopped <= BOUND
        agents, states = await asyncio.to_thread(_status, fed)
        assert states["west"] == "DOWN"
        assert agents["spec_w"]["error_code"] == SITE_LINK_LOST
        await asyncio.sleep(2)
        fed.brokers["west"].start()
        results = await asyncio.gather(*waiting)
        assert sorted(r.details["result"]["tag"] for r in results) == ["west-1", "west-2"]
        links.lines.clear()
        assert await asyncio.to_thread(links.wait_line, f"{west_link} 1", 30)
