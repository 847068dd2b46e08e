"""Broker restarts under a fleet of three sites of 100 agents: no storm of false incidents.

The agents run in one worker process per broker (bench.fleet_worker, as the bench's
figures 9 and 15 run them), each a VOXAgent with its own identity, ledger and heartbeat;
the site masters on the core own their site's link (docs/federation.md). An independent
mosquitto_sub on the core, whose session outlives the restart, records every war-room
post. Bounds (docs/federation.md, "Restarts and partitions"): after a core restart no
incident about any agent and at most one SITE_LINK_LOST per site, resolved; after a site
restart exactly one incident, for that site, resolved; every agent heard live ACTIVE
again (the restarted ones with a newer epoch) within the documented bound; a command
accepted before the outage runs exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kits.federationkit import running_federation
from tests.kits.stormkit import (
    BRIDGE_KEEPALIVE,
    PER_SITE,
    SITES,
    check_incidents,
    restart,
    sites_fleet,
    tally,
    war_room_witness,
    workers,
)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)  # 304 agents start in about 30 s on the 2-core VM
def test_a_core_restart_gives_no_incident_about_any_agent(tmp_path: Path) -> None:
    tally_file = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", sites_fleet(tally_file), bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        witness = war_room_witness(fed)
        try:
            back = restart(fed, "core", 100)
            print(f"core restart: every agent ACTIVE again after {back:.1f} s")
            check_incidents(fed, witness, sites=[])
        finally:
            witness.close()
    assert sorted(tally(tally_file)) == sorted(str(100 + s) for s in range(SITES))


@pytest.mark.timeout(300)
def test_a_site_restart_gives_one_incident_for_the_site(tmp_path: Path) -> None:
    tally_file = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", sites_fleet(tally_file), bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        witness = war_room_witness(fed)
        try:
            back = restart(fed, "site-1", 200)
            print(f"site restart: every agent ACTIVE again after {back:.1f} s")
            check_incidents(fed, witness, sites=["site-1"])
        finally:
            witness.close()
    assert sorted(tally(tally_file)) == sorted(str(200 + s) for s in range(SITES))


def test_fleet_shape() -> None:
    """The fleet these tests run is what they say: 3 sites of 100, masters on the core."""
    text = sites_fleet(Path(os.devnull))
    assert text.count("[[agents]]") == 1 + SITES * (1 + PER_SITE)
