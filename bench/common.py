"""What every figure shares: a rendered, ACL'd private broker, agent configs, stats, a figure row.

The broker is started from `render_broker_dir` output (passwords, ACL, `set_tcp_nodelay true`),
exactly as a fleet would run it, on a free loopback port. VOX agents and the raw baseline log
in with the same identities, so both sides pass the same ACL checks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from bench.report import REPO
from tests.kits.fleetproc import fleet_text as tests_fleet_text
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli.looks import load_reader, observing
from vox_mqtt.fleet.bundles import fleet_agent_config, fleet_operator_config
from vox_mqtt.observe.status import ACTIVE, FleetView
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.protocol.topics import WARROOM_FILTER
from vox_mqtt.transport.session import BrokerSettings

# The tree of figures 1-3: the operator is the root's master.
SEED_SHAPE: dict[str, str | None] = {
    "root": None,
    "coordinator": "root",
    "spec_a": "coordinator",
    "spec_b": "coordinator",
}


@contextlib.asynccontextmanager
async def fresh_look(console_file: Path) -> AsyncIterator[FleetView]:
    """A fresh look at the statuses as `vox status` takes it: the operator's status look
    identity, no session and no ledger (a console of the operator's own identity is refused
    where the broker locks client ids to usernames: docs/broker.md)."""
    async with observing(load_reader(console_file, "status"), warroom=False) as seen:
        yield seen.view


def active_count(view: FleetView) -> int:
    """Return how many agents the view reads ACTIVE."""
    return sum(agent.status == ACTIVE for agent in view.agents())


async def spawn_worker(
    bench: BenchBroker, fleet_file: Path, state: Path, names: list[str], *options: str
) -> asyncio.subprocess.Process:
    """Start one `bench.fleet_worker` process hosting the named agents on bench's broker."""
    args = ["--fleet", str(fleet_file), "--broker-dir", str(bench.root)]
    args += ["--port", str(bench.port), "--state", str(state), *options]
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.fleet_worker", *args, *names,
        stdout=asyncio.subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


async def workers_ready(workers: list[asyncio.subprocess.Process], within: float) -> None:
    """Wait until every worker has said `ready` (each within the given seconds)."""
    for worker in workers:
        assert worker.stdout is not None
        async with asyncio.timeout(within):
            line = await worker.stdout.readline()
        assert line.startswith(b"ready"), line


async def stop_workers(workers: list[asyncio.subprocess.Process]) -> None:
    """Terminate the workers still running and reap them all."""
    for worker in workers:
        if worker.returncode is None:
            worker.terminate()
    for worker in workers:
        await worker.wait()


def fleet_text(
    shape: Mapping[str, str | None],
    *,
    heartbeat: float = 15.0,
    roles: Mapping[str, list[str]] | None = None,
) -> str:
    """Return a fleet file for {name: master name or None}, heartbeats as agents default.

    roles: {name: ["module:Class", ...]}, what a daemon of that agent loads (in-process
    agents get their role objects from the figure instead).
    """
    return tests_fleet_text(shape, heartbeat=heartbeat, roles=roles)


def tree_shape(agents: int, fanout: int) -> dict[str, str | None]:
    """Return a balanced tree of `agents` agents named agent-N, each master with `fanout` kids."""
    return {f"agent-{i}": None if i == 0 else f"agent-{(i - 1) // fanout}" for i in range(agents)}


_STORES: dict[Path, CredentialStore] = {}


@dataclass
class BenchBroker:
    """A broker rendered from a fleet (running, where `broker` is set) and its identities."""

    fleet: Fleet
    root: Path  # the rendered broker directory
    port: int
    workdir: Path  # agents' state dirs go under it
    broker: LocalBroker | None = None

    @property
    def broker_pid(self) -> int:
        """Return the running broker's process id."""
        assert self.broker is not None
        return self.broker.pid

    def creds(self, name: str) -> Credentials:
        """Return the plain-listener credentials of an identity (agent, operator, explorer)."""
        # One store per broker directory: it re-reads its file only when it changed, so a
        # worker starting a thousand agents does not parse a thousand identities each time.
        store = _STORES.get(self.root)
        if store is None:
            store = _STORES[self.root] = CredentialStore(self.root)
        return store.get(name)

    def id(self, name: str) -> UUID:
        """Return an identity's UUID by name (the operator's too)."""
        if name == self.fleet.operator_name:
            return self.fleet.operator_id
        return self.fleet.agent(name).id

    def settings(self, name: str, **overrides: Any) -> BrokerSettings:
        """Return transport settings that log in as the named identity."""
        creds = self.creds(name)
        values: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "username": creds.username,
            "password": creds.password,
            "client_id": creds.username,
            "keepalive": 30,
        }
        values.update(overrides)
        return BrokerSettings(**values)

    def agent_config(self, name: str, **overrides: Any) -> AgentConfig:
        """Return one agent's runtime config: itself, its master, its children."""
        return fleet_agent_config(
            self.fleet,
            name,
            broker=self.settings(name),
            state_dir=self.workdir / "state" / name,
            **overrides,
        )

    def operator_config(self, **overrides: Any) -> AgentConfig:
        """Return the operator console's config: the root's master, publishing no status."""
        fleet = self.fleet
        values: dict[str, Any] = {"observe": (WARROOM_FILTER,)}
        values.update(overrides)
        return fleet_operator_config(
            fleet,
            broker=self.settings(fleet.operator_name),
            state_dir=self.workdir / "state" / fleet.operator_name,
            **values,
        )


@contextlib.contextmanager
def bench_broker(
    workdir: Path, fleet_toml: str, *, extra_acl: Mapping[str, list[str]] | None = None
) -> Iterator[BenchBroker]:
    """Render the fleet's broker directory under workdir and run mosquitto from it.

    extra_acl: {identity name: acl_file topic lines} appended for a foreign client's own
    topics (FastStream's reply topics), so everything else stays as rendered.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = parse_fleet(fleet_toml)
    broker_dir = render_broker_dir(
        fleet, workdir / "broker", port=free_port(), explorer=True, run_as_user=getpass.getuser()
    )
    if extra_acl:
        acl = broker_dir.root / "acl"
        lines = [acl.read_text(encoding="utf-8").rstrip("\n")]
        for name, rules in extra_acl.items():
            username = CredentialStore(broker_dir.root).get(name).username
            lines += [f"user {username}", *rules]
        acl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with LocalBroker(broker_dir.conf, port=broker_dir.port) as broker:
        yield BenchBroker(
            fleet=fleet, root=broker_dir.root, port=broker_dir.port, workdir=workdir, broker=broker
        )


def percentile(samples: list[float], fraction: float) -> float:
    """Return the nearest-rank percentile of samples (fraction in 0..1)."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_summary(samples_ms: list[float]) -> dict[str, float]:
    """Return p50, p99, mean and count of round-trip times in milliseconds."""
    return {
        "p50_ms": round(statistics.median(samples_ms), 3),
        "p99_ms": round(percentile(samples_ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(samples_ms), 3),
        "n": len(samples_ms),
    }


def figure(
    *,
    title: str,
    unit: str,
    vox: float,
    baseline: float,
    target: str,
    met: bool | None,
    higher_is_better: bool = False,
    **details: Any,
) -> dict[str, Any]:
    """Return one figure row: VOX, baseline, their ratio, the target and whether it was met."""
    return {
        "title": title,
        "unit": unit,
        "vox": round(vox, 3),
        "baseline": round(baseline, 3),
        "ratio": round(vox / baseline, 2) if baseline else None,
        "target": target,
        "met": met,
        "higher_is_better": higher_is_better,
        **details,
    }


def run_alone(doc: str, run: Callable[[Path, bool], Any]) -> int:
    """Run one figure from its own module's command line and print it as JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vox-bench-") as tmp:
        print(json.dumps(run(Path(tmp), args.quick), indent=2))
    return 0


class Stopwatch:
    """Elapsed wall time since construction, in seconds."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Return the seconds since the stopwatch started."""
        return time.perf_counter() - self.started


# A bare paho client process: log in, register a will, keep the connection alive, nothing else.
BARE_CLIENT = """
import sys
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
port, user, password, client_id, keepalive = sys.argv[1:]
client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
client.username_pw_set(user, password)
client.will_set(f"vox/{user}/status", b"gone", qos=1)
client.connect("127.0.0.1", int(port), keepalive=int(keepalive))
client.loop_forever()
"""
