"""Figure 4: ledger throughput, group commit against one commit per record, on a real file.

    python -m bench.ledger_bench [--records N] [--concurrency C] [--dir DIR] [--json]

Every mode writes the same records with the same number of concurrent producers into a
fresh ledger with synchronous=FULL; only the batching differs. Put --dir on the disk the
agents will use: on tmpfs fsync is free and the comparison means nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import figure
from vox_mqtt.ledger.store import VOXAgentMemory

# (name, constructor keywords): the last one is the baseline.
MODES: list[tuple[str, dict[str, Any]]] = [
    ("group commit, 2 ms window (default)", {}),
    ("group commit, no window", {"commit_window": 0.0}),
    ("one commit per record", {"max_batch": 1}),
]


async def throughput(path: Path, records: int, concurrency: int, **options: Any) -> dict[str, Any]:
    """Write `records` rows from `concurrency` producers; return rate and commit count."""
    source, target = uuid4(), uuid4()
    per_producer = records // concurrency

    async with VOXAgentMemory(path, **options) as ledger:

        async def producer() -> None:
            for _ in range(per_producer):
                details = {"message_id": str(uuid4()), "emitted_at": "2026-01-11T08:00:00-03:00"}
                await ledger.record("message", "received", source, target, details)

        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        written = per_producer * concurrency
        report = await ledger.verify()
        if not report.ok or report.rows != written:
            raise SystemExit(f"ledger check failed after the run: {report}")
        return {
            "records": written,
            "seconds": round(elapsed, 3),
            "records_per_second": round(written / elapsed),
            "commits": ledger.commit_count,
        }


async def latency(path: Path, samples: int, **options: Any) -> dict[str, float]:
    """Time single awaited records with no other load: what one acknowledgement waits."""
    async with VOXAgentMemory(path, **options) as ledger:
        times = []
        for n in range(samples):
            started = time.perf_counter()
            await ledger.record("message", "received", None, None, {"n": n})
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 2),
    }


def sizes(quick: bool) -> tuple[int, int, int]:
    """Return (records, concurrent producers, latency samples)."""
    return (400, 40, 50) if quick else (4000, 200, 200)


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 4: the agents' setting (no window) against one commit per record."""
    records, concurrency, samples = sizes(quick)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = asyncio.run(_run_modes(workdir, records, concurrency, samples))
    group, single = rows["group commit, no window"], rows["one commit per record"]
    ratio = group["records_per_second"] / single["records_per_second"]
    return figure(
        title="Ledger: durable records/s, group commit vs one commit per record",
        unit="records/s",
        vox=group["records_per_second"],
        baseline=single["records_per_second"],
        target="group commit > one commit per record (no number set)",
        met=ratio > 1.0,
        higher_is_better=True,
        producers=concurrency,
        modes=list(rows.values()),
    )


async def _run_modes(
    directory: Path, records: int, concurrency: int, samples: int
) -> dict[str, dict[str, Any]]:
    results = {}
    for index, (name, options) in enumerate(MODES):
        rate = await throughput(directory / f"t{index}.db", records, concurrency, **options)
        alone = await latency(directory / f"l{index}.db", samples, **options)
        results[name] = {"mode": name, **rate, **alone}
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per mode (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="where to put the ledgers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.records < args.concurrency or args.concurrency < 1:
        parser.error("need --records >= --concurrency >= 1")
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=args.dir) as tmp:
        found = asyncio.run(_run_modes(Path(tmp), args.records, args.concurrency, 200))
    results = list(found.values())
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    baseline = results[-1]["records_per_second"]
    print(f"ledger: {args.records} records from {args.concurrency} concurrent producers")
    for row in results:
        print(
            f"  {row['mode']:<36} {row['records_per_second']:>8} records/s "
            f"({row['records_per_second'] / baseline:5.1f}x) {row['commits']:>6} commits  "
            f"alone: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
