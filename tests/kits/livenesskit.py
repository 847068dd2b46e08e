"""What the multi-process liveness tests share: the seed fleet's timings, its start, a report.

- `KEEPALIVE`, `HEARTBEAT`: the broker keepalive and heartbeat interval every daemon runs.
- `ALL_COMMANDS`: what the root advertises while the whole tree is ACTIVE.
- `start_fleet(...)`: start the daemons and wait for each one's birth and the root's commands.
- `report(...)`: print one measured detection time (run pytest with -s to see it).
"""

from __future__ import annotations

from tests.kits.faultkit import Deployment, Processes
from tests.kits.recorder import Recorder

KEEPALIVE = 5
HEARTBEAT = 1.0
ALL_COMMANDS = ["analyze", "echo", "slow", "wedge"]


def report(what: str, seconds: float) -> None:
    """Print one measured detection time in a greppable form."""
    print(f"\nDETECTION {what}: {seconds:.3f}s", flush=True)


def start_fleet(
    dep: Deployment, processes: Processes, recorder: Recorder, names: list[str] | None = None
) -> None:
    """Start the daemons; wait for each one's birth and the root advertising everything."""
    processes.start(dep, names)
    for name in names if names is not None else dep.configs:
        recorder.status(dep.id(name), status="ACTIVE", timeout=30)
    recorder.status(dep.id("root"), status="ACTIVE", commands=ALL_COMMANDS, timeout=30)
