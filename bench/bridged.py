"""Figure 8: one hop and three levels across one Mosquitto bridge, against one broker.

The same VOX round trips as figures 1 and 2, twice: every agent on one broker, then
a federated fleet (docs/federation.md) where the crossing hop goes over a rendered
bridge (core <- site, MQTT v5, QoS 1, persistent session) on loopback. One hop: the
operator on the core, the root on the site. Three levels: operator, root and
coordinator's master on the core, the coordinator and its specialists on the site,
so the root -> coordinator hop crosses. The ratio is bridged p50 / one-broker p50.

    python -m bench.bridged [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from uuid import UUID, uuid4

from bench.common import (
    SEED_SHAPE,
    BenchBroker,
    bench_broker,
    figure,
    fleet_text,
    latency_summary,
    run_alone,
)
from bench.one_hop import sizes as hop_sizes
from bench.one_hop import vox_round_trips
from bench.three_levels import sizes as level_sizes
from vox_mqtt.agent.facade import AgentConfig
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet
from vox_mqtt.protocol.sites import chain_up


def bridged_text(shape: dict[str, str | None], on_site: set[str]) -> str:
    """Return the seed tree on brokers core and site (site bridged to core)."""
    ids = {name: uuid4() for name in shape}
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n']
    parts += ['[[brokers]]\nname = "core"\n', '[[brokers]]\nname = "site"\nupstream = "core"\n']
    for name, master in shape.items():
        lines = [f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"', "heartbeat_interval = 15.0"]
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        lines.append(f'broker = "{"site" if name in on_site else "core"}"')
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


@dataclass
class BridgedBench:
    """Agents on two bridged brokers, configured as figures 1-3 configure them."""

    fleet: Fleet
    per_broker: dict[str, BenchBroker]

    def id(self, name: str) -> UUID:
        """Return an identity's UUID by name."""
        return self.per_broker["core"].id(name)

    def agent_config(self, name: str, **overrides: Any) -> AgentConfig:
        """Return the config of an agent, logged into its own broker."""
        broker = self.fleet.agent(name).broker or "core"
        return self.per_broker[broker].agent_config(name, **overrides)

    def operator_config(self, **overrides: Any) -> AgentConfig:
        """Return the operator's config, on the core."""
        return self.per_broker["core"].operator_config(**overrides)


@contextlib.contextmanager
def bridged_bench(workdir: Path, text: str) -> Iterator[BridgedBench]:
    """Render and run the core and the site broker with its bridge."""
    fleet = parse_fleet(text)
    order = sorted(fleet.brokers, key=lambda b: len(list(chain_up(fleet.brokers, b.name))))
    per_broker: dict[str, BenchBroker] = {}
    with contextlib.ExitStack() as stack:
        for spec in order:
            upstream = None if spec.upstream is None else per_broker[spec.upstream].root
            rendered = render_broker_dir(
                fleet,
                workdir / spec.name,
                broker=spec.name,
                port=free_port(),
                upstream_dir=upstream,
                run_as_user=getpass.getuser(),
            )
            broker = stack.enter_context(LocalBroker(rendered.conf, port=rendered.port))
            per_broker[spec.name] = BenchBroker(
                fleet=fleet,
                root=rendered.root,
                port=rendered.port,
                workdir=workdir,
                broker=broker,
            )
        yield BridgedBench(fleet=fleet, per_broker=per_broker)


async def _round_trips(
    bench: BenchBroker | BridgedBench, names: list[str], command: str, count: int, warmup: int
) -> dict[str, float]:
    return latency_summary(
        await vox_round_trips(cast(BenchBroker, bench), names, command, count, warmup)
    )


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Time both chains on one broker and across the bridge."""
    rows = []
    cases = (
        ("one hop", ["root"], "ping", {"root", "coordinator", "spec_a", "spec_b"}, hop_sizes),
        (
            "three levels",
            ["root", "coordinator", "spec_a", "spec_b"],
            "echo",
            {"coordinator", "spec_a", "spec_b"},
            level_sizes,
        ),
    )
    for label, names, command, on_site, sizes in cases:
        count, warmup = sizes(quick)
        with bench_broker(workdir / f"{label}-one", fleet_text(SEED_SHAPE)) as one:
            single = await _round_trips(one, names, command, count, warmup)
        with bridged_bench(workdir / f"{label}-two", bridged_text(SEED_SHAPE, on_site)) as two:
            bridged = await _round_trips(two, names, command, count, warmup)
        rows.append(
            figure(
                title=f"{label.capitalize()} across one bridge vs one broker (VOX p50)",
                unit="ms",
                vox=bridged["p50_ms"],
                baseline=single["p50_ms"],
                target="none set (the bridge's cost: one more broker hop each way)",
                met=None,
                bridged_detail=bridged,
                one_broker_detail=single,
            )
        )
    return rows


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 8 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 8 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
