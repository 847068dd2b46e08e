"""Figure 23: laying out the status tree of a big fleet, as `vox status`, `vox watch` and the
console's text draw it (cli/statusview._tree_order), against the per-agent lookup it replaced.

    .venv/bin/python -m bench.tree_order [--quick]

The fleet is 10,000 agents (1,000 with --quick), ten children per master, each known to a
real FleetObserver. The baseline is the old way, measured in the same run: each agent's
children asked of the view one agent at a time (FleetView.get_children walks every agent),
n^2 steps. `vox watch` lays the tree out on every frame (each 0.5 s); at 10,000 agents on a
busy machine the old way made a 15 s watch end 85 s late (docs/performance.md, "The tree's
order").
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

from bench.common import figure, run_alone
from vox_mqtt.cli.statusview import _tree_order
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import AgentLiveness

FRAME_PAUSE = 0.5  # seconds between two frames of `vox watch` (cli/watchview.py)


def fleet(agents: int) -> tuple[FleetObserver, UUID]:
    """Return an observer that knows `agents` agents in a tree of ten children per master."""
    observer = FleetObserver(stale_after=30.0)
    ids = [uuid4() for _ in range(agents)]
    for index, agent in enumerate(ids):
        entry = observer.view.watch(agent, f"agent-{index}")
        entry.master_id = None if index == 0 else ids[(index - 1) // 10]
    return observer, ids[0]


def per_agent_lookup(
    observer: FleetObserver, top: UUID, agents: dict[UUID, AgentLiveness]
) -> list[tuple[int, AgentLiveness]]:
    """The tree's order as it was found before: the view asked for each agent's children."""
    order = [(0, agents[top])]

    def grow(parent: UUID, depth: int) -> None:
        children = [agents[a.id] for a in observer.view.get_children(parent) if a.id in agents]
        for entry in sorted(children, key=lambda a: a.name):
            order.append((depth + 1, entry))
            grow(entry.id, depth + 1)

    grow(top, 0)
    return order


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Time both ways over the same fleet; check they agree."""
    size = 1_000 if quick else 10_000
    observer, top = fleet(size)
    agents = {entry.id: entry for entry in observer.view.agents()}
    started = time.perf_counter()
    order = _tree_order(SimpleNamespace(top=top), observer, agents)  # type: ignore[arg-type]
    one_pass = time.perf_counter() - started
    started = time.perf_counter()
    before = per_agent_lookup(observer, top, agents)
    lookups = time.perf_counter() - started
    assert [(d, e.id) for d, e in order] == [(d, e.id) for d, e in before]
    return figure(
        title=f"The status tree of {size:,} agents laid out (vox status, vox watch's frame)",
        unit="ms",
        vox=one_pass * 1000,
        baseline=lookups * 1000,
        target=f"within a watch frame's pause ({FRAME_PAUSE:g} s)",
        met=one_pass < FRAME_PAUSE,
        agents=size,
        times_faster=round(lookups / one_pass, 1),
        baseline_is="each agent's children asked of the view (FleetView.get_children)",
    )


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
