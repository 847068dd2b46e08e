"""Figure 2: operator -> root -> coordinator -> specialist and back, against raw relays.

VOX: the operator asks the root for `echo`; the root delegates to the coordinator, which
delegates to the specialist that serves it; every hop records, acknowledges and answers with
handled_by. Raw: the same chain of bare clients, each relay forwarding the request down and
the response up, one QoS 1 publish per leg (6 in all). N sequential round trips each.

    python -m bench.three_levels [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import SEED_SHAPE, bench_broker, figure, fleet_text, latency_summary
from bench.one_hop import raw_round_trips, vox_round_trips

CHAIN = ["operator", "root", "coordinator", "spec_a"]


def sizes(quick: bool) -> tuple[int, int]:
    """Return (round trips, warm-up round trips)."""
    return (20, 3) if quick else (300, 20)


async def measure(workdir: Path, quick: bool) -> dict[str, Any]:
    """Run both sides on one broker, raw first."""
    count, warmup = sizes(quick)
    with bench_broker(workdir, fleet_text(SEED_SHAPE)) as bench:
        raw = latency_summary(await raw_round_trips(bench, CHAIN, count, warmup))
        vox = latency_summary(await vox_round_trips(bench, CHAIN[1:], "echo", count, warmup))
    ratio = vox["p50_ms"] / raw["p50_ms"]
    return figure(
        title="Three levels: operator -> root -> coordinator -> specialist and back (p50)",
        unit="ms",
        vox=vox["p50_ms"],
        baseline=raw["p50_ms"],
        target="VOX p50 <= 1.5 x raw",
        met=ratio <= 1.5,
        vox_detail=vox,
        baseline_detail=raw,
        p99_ratio=round(vox["p99_ms"] / raw["p99_ms"], 2),
    )


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 2 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 2 alone and print it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vox-bench-") as tmp:
        print(json.dumps(run(Path(tmp), args.quick), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
