"""`vox demo --sites`: the seed fleet over a core and two chained site brokers, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.demokit import assert_nothing_left, run_demo
from vox_mqtt.protocol.hierarchy import load_fleet

# One bounded demo process (run_demo's timeout), slower than the default cap when loaded.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_the_demo_runs_every_step_across_two_bridges(tmp_path: Path) -> None:
    directory = tmp_path / "demo-fleet"
    output = run_demo(directory, "--sites", timeout=360)
    fleet = load_fleet(directory / "fleet.toml")
    assert {agent.name: agent.broker for agent in fleet} == {
        "root": "core",
        "coordinator": "plant-a",
        "specialist_a": "plant-a",
        "specialist_b": "plant-b",
    }
    for site, upstream in (("plant-a", "core"), ("plant-b", "plant-a")):
        assert f"--broker {site}" in output
        assert f"and a bridge to {upstream!r}" in output
        assert (directory / "sites" / site / "bridge" / "bridge.conf").is_file()
    # Step 6's war-room post about specialist_b crossed both bridges to the core.
    assert "7. specialist_b is killed" in output
    assert "demo step" not in output  # no step failed
    assert (directory / "config" / "coordinator.links.json").is_file()
    assert_nothing_left(directory)
