"""Host many VOXAgents of one rendered fleet in this process, for the footprint figure.

    python -m bench.fleet_worker --fleet FLEET.toml --broker-dir DIR --port P --state DIR NAME...

Agents in one process share its event loop, as a load generator may; each keeps its own MQTT
session, ledger and liveness duties exactly as a daemon would. Prints `ready N` once every
agent is up, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchBroker
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.protocol.hierarchy import load_fleet


async def serve(bench: BenchBroker, names: list[str], heartbeat: float) -> None:
    """Start the agents leaves first, say ready, and wait for a stop signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    fleet = bench.fleet
    names.sort(key=lambda n: -fleet.depth_of(fleet.agent(n).id))
    async with AsyncExitStack() as stack:
        for name in names:
            config = bench.agent_config(name, heartbeat_interval=heartbeat)
            await stack.enter_async_context(VOXAgent(config))
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
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    bench = BenchBroker(
        fleet=load_fleet(args.fleet), root=args.broker_dir, port=args.port, workdir=args.state
    )
    asyncio.run(serve(bench, list(args.names), args.heartbeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
