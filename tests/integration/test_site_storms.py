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
@pytest.mark.parametrize(
    ("broker", "tag", "sites_with_incident"),
    [("core", 100, []), ("site-1", 200, ["site-1"])],
    ids=["a core restart gives no incident about any agent", "a site restart gives one"],
)
def test_a_broker_restart_gives_at_most_one_incident_per_site(
    tmp_path: Path, broker: str, tag: int, sites_with_incident: list[str]
) -> None:
    tally_file = tmp_path / "tally.txt"
    with running_federation(
        tmp_path / "fed", sites_fleet(tally_file), bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        witness = war_room_witness(fed)
        try:
            back = restart(fed, broker, tag)
            print(f"{broker} restart: every agent ACTIVE again after {back:.1f} s")
            check_incidents(fed, witness, sites=sites_with_incident)
        finally:
            witness.close()
    assert sorted(tally(tally_file)) == sorted(str(tag + s) for s in range(SITES))


def test_fleet_shape() -> None:
    """The fleet these tests run is what they say: 3 sites of 100, masters on the core."""
    text = sites_fleet(Path(os.devnull))
    assert text.count("[[agents]]") == 1 + SITES * (1 + PER_SITE)
