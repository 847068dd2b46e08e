"""Host many VOXAgents of one rendered fleet in this process, for the footprint figure.

    python -m bench.fleet_worker --fleet FLEET.toml --broker-dir DIR --port P --state DIR NAME...

Agents in one process share its event loop, as a load generator may; each keeps its own MQTT
session, ledger and liveness duties exactly as a daemon would. Prints `ready N` once every
agent is up, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchBroker
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import load_role
from vox_mqtt.broker.federation import link_map
from vox_mqtt.fleet.bundles import reconnect_settings
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet

STARTING_TOGETHER = 25
CONNECT_TIMEOUT = 120.0


def _agent(
    fleet: Fleet, bench: BenchBroker, name: str, heartbeat: float, spread: float | None
) -> VOXAgent:
    """Return the VOXAgent of one agent of the fleet, its roles loaded as a daemon would.

    spread: the first reconnect try's window; None: sized to the agents on its broker, as
    `vox agent render` writes it (docs/federation.md, "Restarts and partitions").
    """
    agent = fleet.agent(name)
    reconnect = reconnect_settings(fleet, agent.broker)
    first = reconnect["reconnect_min"] if spread is None else spread
    # In a federated fleet the link owners watch their bridges, as daemons do with the
    # NAME.links.json `vox agent render` writes (docs/federation.md).
    config = bench.agent_config(name, heartbeat_interval=heartbeat, links=link_map(fleet, agent.id))
    # Thousands of agents starting on two cores: a connect may wait its turn for long.
    broker = replace(
        config.broker,
        connect_timeout=CONNECT_TIMEOUT,
        reconnect_min=first,
        reconnect_max=max(first, reconnect["reconnect_max"]),
    )
    config = replace(config, broker=broker)
    return VOXAgent(config, [load_role(spec, agent.settings) for spec in agent.roles])


async def serve(
    bench: BenchBroker, names: list[str], heartbeat: float, spread: float | None = None
) -> None:
    """Start the agents leaves first, say ready, and wait for a stop signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    fleet = bench.fleet
    by_depth: dict[int, list[str]] = {}
    for name in names:
        by_depth.setdefault(fleet.depth_of(fleet.agent(name).id), []).append(name)
    async with AsyncExitStack() as stack:
        # Leaves first, a level at a time; within a level STARTING_TOGETHER at once, so a
        # thousand agents do not wait for each other's connect and first commit in turn.
        for depth in sorted(by_depth, reverse=True):
            level = by_depth[depth]
            for first in range(0, len(level), STARTING_TOGETHER):
                chunk = level[first : first + STARTING_TOGETHER]
                await asyncio.gather(
                    *(
                        stack.enter_async_context(_agent(fleet, bench, n, heartbeat, spread))
                        for n in chunk
                    )
                )
        print(f"ready {len(names)}", flush=True)
        await stop.wait()


def main() -> int:
    """Parse the arguments and serve the named agents."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--broker-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--heartbeat", type=float, default=15.0)
    parser.add_argument(
        "--reconnect-spread",
        type=float,
        default=None,
        help="first reconnect window in seconds (default: sized to the agents on the broker)",
    )
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    # Warnings with their time: a fault test reads the order of losses, posts and reconnects.
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    bench = BenchBroker(
        fleet=load_fleet(args.fleet), root=args.broker_dir, port=args.port, workdir=args.state
    )
    asyncio.run(serve(bench, list(args.names), args.heartbeat, args.reconnect_spread))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
