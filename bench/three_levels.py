"""Figure 2: operator -> root -> coordinator -> specialist and back, against raw relays.

VOX: the operator asks the root for `echo`; the root delegates to the coordinator, which
delegates to the specialist that serves it; every hop records, acknowledges and answers with
handled_by. Raw: the same chain of bare clients, each relay forwarding the request down and
the response up, one QoS 1 publish per leg (6 in all). N sequential round trips each, VOX
in both layouts (all-in-one and process per agent, as figure 1).

    python -m bench.three_levels [--quick]
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.common import run_alone
from bench.one_hop import compare_chain

CHAIN = ["operator", "root", "coordinator", "spec_a"]


def sizes(quick: bool) -> tuple[int, int]:
    """Return (round trips, warm-up round trips)."""
    return (20, 3) if quick else (300, 20)


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Time round trips down the chain and back, raw and VOX."""
    count, warmup = sizes(quick)
    return await compare_chain(
        workdir,
        CHAIN,
        "echo",
        title="Three levels: operator -> root -> coordinator -> specialist and back (p50)",
        count=count,
        warmup=warmup,
        bound=1.2,
    )


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 2 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 2 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
