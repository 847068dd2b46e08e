"""Figure 21: figures 1 and 2 again with one core kept busy, judged against the floor.

Edge hosts are busy. A process spinning on one core (`while True: pass`) runs for the whole
figure; one hop and three levels are then measured exactly as figures 1 and 2 measure them
(bench/one_hop.compare_chain): the raw clients, the obligations floor (raw clients that
acknowledge and commit as a hop must) and VOX, in the same loaded run. The target is VOX's
p50 against the floor measured beside it (docs/performance.md: the hot path is judged against the
floor); the raw ratio is reported beside it.

    python -m bench.loaded [--quick]
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import figure, run_alone
from bench.one_hop import ALL_IN_ONE, LAYOUTS, compare_chain
from bench.three_levels import CHAIN as THREE_LEVELS

BOUND_OVER_FLOOR = 1.5
SPIN = "while True: pass"


def sizes(quick: bool) -> tuple[int, int]:
    """Return (round trips, warm-up round trips)."""
    return (20, 3) if quick else (300, 20)


@contextmanager
def one_core_busy() -> Iterator[int]:
    """Keep one core busy with a spinning process for as long as the block runs."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        yield spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


def over_floor(row: dict[str, Any], spinner: int) -> dict[str, Any]:
    """Turn a figure-1/2 row into this figure's row: VOX against the floor measured beside it."""
    vox, raw, floor = row["vox_detail"], row["baseline_detail"], row["obligations_detail"]
    ratio = vox["p50_ms"] / floor["p50_ms"]
    head, sep, tail = row["title"].partition(":")
    return figure(
        title=f"{head}, one core busy{sep}{tail}",
        unit="ms",
        vox=vox["p50_ms"],
        baseline=floor["p50_ms"],
        target=f"VOX p50 <= {BOUND_OVER_FLOOR:g} x the floor in the same loaded run",
        met=ratio <= BOUND_OVER_FLOOR,
        layout=row["layout"],
        vox_detail=vox,
        baseline_detail=floor,
        raw_detail=raw,
        vox_over_raw=round(vox["p50_ms"] / raw["p50_ms"], 2),
        obligations_ratio=row["obligations_ratio"],
        spinner_pid=spinner,
    )


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Time one hop and three levels with one core busy: raw, floor and VOX."""
    count, warmup = sizes(quick)
    # The quick run (the suite's smoke test) keeps one layout: it checks the figure's
    # shape, and each layout costs a tree of daemons.
    layouts = (ALL_IN_ONE,) if quick else LAYOUTS
    rows: list[dict[str, Any]] = []
    with one_core_busy() as spinner:
        for chain, command, title in (
            (["operator", "root"], "ping", "One hop (p50)"),
            (THREE_LEVELS, "echo", "Three levels (p50)"),
        ):
            measured = await compare_chain(
                workdir,
                chain,
                command,
                title=f"{title}: operator round trip",
                count=count,
                warmup=warmup,
                bound=BOUND_OVER_FLOOR,
                layouts=layouts,
            )
            rows.extend(over_floor(row, spinner) for row in measured)
    return rows


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 21 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 21 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
