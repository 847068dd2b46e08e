"""free_port hands a port to one broker only, across calls and processes (broker/local.py)."""

from __future__ import annotations

import subprocess
import sys

from vox_mqtt.broker.local import free_port


def test_a_port_is_handed_out_once_in_a_process_and_not_to_another_process() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    mine = ports[0]
    # Another process of this user is not handed it while the reservation holds.
    code = f"from vox_mqtt.broker.local import _reserve; print(_reserve({mine}))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert other.stdout.strip() == "False", other.stdout + other.stderr
