"""Figure 10: a broker reload for a changed fleet drops no connected session.

A broker rendered for N agents (1,000; 50 with --quick) has one connected client per
agent. The fleet gains an agent; `render_broker_dir` rewrites the directory and
`reload_broker` validates the ACL, sends SIGHUP and proves the new rules with its
canary. Measured: how many of the N sessions dropped (every client then publishes its
own status at QoS 1 on the same connection, and the broker's log is searched for their
disconnection), and how long from the reload until the new agent can log in and publish.

    python -m bench.reload_sessions [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiomqtt

from bench.common import BenchBroker, bench_broker, figure, fleet_text, run_alone, tree_shape
from bench.rawmqtt import raw_client
from vox_mqtt.broker.reload import reload_broker
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.hierarchy import parse_fleet


def sizes(quick: bool) -> int:
    """Return how many connected agents the reload must keep."""
    return 50 if quick else 1000


async def _publish_own_status(client: aiomqtt.Client, bench: BenchBroker, name: str) -> bool:
    try:
        async with asyncio.timeout(10):
            await client.publish(topics.status(bench.id(name)), b"", qos=1)
    except (aiomqtt.MqttError, TimeoutError):
        return False
    return True


async def measure(workdir: Path, agents: int) -> dict[str, Any]:
    """Connect a client per agent, add an agent, reload, and count what survived."""
    text = fleet_text(tree_shape(agents, 10))
    with bench_broker(workdir, text) as bench:
        names = [spec.name for spec in bench.fleet]
        async with AsyncExitStack() as stack:
            clients = {}
            for name in names:
                client = raw_client(bench, name)
                await stack.enter_async_context(client)
                clients[name] = client
            # The fleet gains one agent under the root: same ids, same secrets, one more user.
            grown = parse_fleet(
                text + f'\n[[agents]]\nname = "newcomer"\nid = "{uuid4()}"\n'
                f'master_id = "{bench.fleet.root.id}"\n'
            )
            render_broker_dir(
                grown,
                bench.root,
                port=bench.port,
                explorer=True,
                run_as_user=getpass.getuser(),
            )
            log_before = _broker_log(bench)
            started = time.perf_counter()
            reload_broker(bench.root, pid=bench.broker_pid)
            newcomer = BenchBroker(
                fleet=grown, root=bench.root, port=bench.port, workdir=workdir, broker=bench.broker
            )
            reload_seconds = await _until_newcomer_publishes(newcomer, started)
            alive = await asyncio.gather(
                *(_publish_own_status(clients[n], bench, n) for n in names)
            )
            dropped_log = _dropped_since(bench, log_before, names)
    return {
        "agents_connected": agents,
        "sessions_dropped": agents - sum(alive),
        "disconnections_in_broker_log": dropped_log,
        "seconds_until_newcomer_publishes": round(reload_seconds, 3),
    }


async def _until_newcomer_publishes(bench: BenchBroker, started: float) -> float:
    async with asyncio.timeout(30):
        while True:
            with contextlib.suppress(aiomqtt.MqttError):
                async with raw_client(bench, "newcomer") as client:
                    await client.publish(topics.status(bench.id("newcomer")), b"", qos=1)
                    return time.perf_counter() - started
            await asyncio.sleep(0.02)


def _broker_log(bench: BenchBroker) -> int:
    assert bench.broker is not None
    return len(bench.broker.log_text())


def _dropped_since(bench: BenchBroker, offset: int, names: list[str]) -> int:
    assert bench.broker is not None
    tail = bench.broker.log_text()[offset:]
    ids = {f"{bench.id(n)}-raw" for n in names}
    return sum(
        1
        for line in tail.splitlines()
        if "disconnect" in line.lower() or "closed its connection" in line
        if any(client_id in line for client_id in ids)
    )


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 10."""
    detail = asyncio.run(measure(workdir, sizes(quick)))
    return figure(
        title=f"Reload for a grown fleet with {detail['agents_connected']} sessions connected: "
        "sessions dropped",
        unit="sessions",
        vox=detail["sessions_dropped"],
        baseline=0,
        target="0 dropped",
        met=detail["sessions_dropped"] == 0 and detail["disconnections_in_broker_log"] == 0,
        detail=detail,
    )


def main() -> int:
    """Run figure 10 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
