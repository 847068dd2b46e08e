"""Run the benchmarks and write BENCHMARKS.md and results.json.

    python -m bench [--quick] [--only NAME[,NAME...]] [--out DIR] [--ledger-sync normal]

A full run (no --quick, no --only) writes BENCHMARKS.md at the repository root and
bench/results.json; other runs print the table and write files only with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    bridged,
    burst_read,
    detection,
    doors,
    exporter_scrape,
    faststream_rpc,
    fleet_large,
    floor_parts,
    footprint,
    ledger_bench,
    loaded,
    metrics_cost,
    one_hop,
    reload_sessions,
    render_large,
    request_life,
    scale,
    signatures,
    three_levels,
    throughput,
    tree_order,
    verb_speed,
    web_console,
)
from bench.report import REPO, figure_table, machine, markdown
from bench.voxside import LEDGER_SYNC_ENV

Runner = Callable[[Path, bool], "dict[str, Any] | list[dict[str, Any]]"]
FIGURES: dict[str, tuple[int, Runner]] = {
    "one_hop": (1, one_hop.run),
    "three_levels": (2, three_levels.run),
    "throughput": (3, throughput.run),
    "ledger": (4, ledger_bench.run),
    "detection": (5, detection.run),
    "footprint": (6, footprint.run),
    "render": (7, render_large.run),
    "bridged": (8, bridged.run),
    "fleet_large": (9, fleet_large.run),
    "reload": (10, reload_sessions.run),
    "exporter": (11, exporter_scrape.run),
    "metrics_cost": (12, metrics_cost.run),
    "faststream": (13, faststream_rpc.run),
    "web_console": (14, web_console.run),
    "signatures": (15, signatures.run),
    "scale": (16, scale.run),
    "request_life": (17, request_life.run),
    "burst_read": (18, burst_read.run),
    "doors": (19, doors.run),
    "verbs": (20, verb_speed.run),
    "loaded": (21, loaded.run),
    "floor_parts": (22, floor_parts.run),
    "tree": (23, tree_order.run),
}


def run_figures(names: list[str], quick: bool) -> dict[str, Any]:
    """Run the named figures in order; a failing one is reported and the rest still run."""
    figures: dict[str, Any] = {}
    for name in names:
        number, runner = FIGURES[name]
        print(f"figure {number}: {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"vox-bench-{name}-") as tmp:
            try:
                outcome = runner(Path(tmp), quick)
            except Exception as exc:
                traceback.print_exc()
                figures[name] = {"number": number, "error": f"{type(exc).__name__}: {exc}"}
                continue
        rows = outcome if isinstance(outcome, list) else [outcome]
        figures[name] = {
            "number": number,
            "seconds": round(time.perf_counter() - started, 1),
            "rows": rows,
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the figures, write or print the results."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds per figure")
    parser.add_argument("--only", default="", help=f"comma-separated figures: {', '.join(FIGURES)}")
    parser.add_argument("--out", type=Path, help="write BENCHMARKS.md and results.json here")
    parser.add_argument(
        "--ledger-sync",
        choices=("full", "normal"),
        default="full",
        help="the agents' ledger_sync (docs/ledger.md); only full is the documented default",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite BENCHMARKS.md from a run's results.json (after docs/performance.md changed)",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        saved = (args.out or REPO / "bench") / "results.json"
        written = (args.out or REPO) / "BENCHMARKS.md"
        try:
            earlier: dict[str, Any] = json.loads(saved.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read the results of a run from {saved}: {exc}")
        written.write_text(markdown(earlier), encoding="utf-8")
        print(f"wrote {written} from {saved}", file=sys.stderr)
        return 0
    os.environ[LEDGER_SYNC_ENV] = args.ledger_sync  # worker processes read it too
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    os.chdir(REPO)  # worker processes import `bench` and the test roles from here
    given = " ".join(sys.argv[1:] if argv is None else argv)
    command = f"make bench BENCH_ARGS='{given}'" if given else "make bench"
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "ledger_sync": args.ledger_sync,
        "machine": machine(),
    }
    results["figures"] = run_figures(names, args.quick)
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    full = not args.quick and not args.only and args.ledger_sync == "full"
    out = args.out
    md_path: Path | None
    json_path: Path | None
    if out is None and full:
        md_path, json_path = REPO / "BENCHMARKS.md", REPO / "bench" / "results.json"
    elif out is not None:
        out.mkdir(parents=True, exist_ok=True)
        md_path, json_path = out / "BENCHMARKS.md", out / "results.json"
    else:
        md_path = json_path = None
    print("\n".join(figure_table(results)))
    if md_path is not None and json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        md_path.write_text(markdown(results), encoding="utf-8")
        print(f"wrote {md_path} and {json_path}", file=sys.stderr)
    failed = [n for n, entry in results["figures"].items() if "error" in entry]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
