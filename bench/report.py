"""The machine a run measured, and BENCHMARKS.md written from a run's results."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from vox_mqtt.broker.local import find_mosquitto

REPO = Path(__file__).resolve().parent.parent
ANALYSIS = REPO / "docs" / "performance.md"


def machine() -> dict[str, Any]:
    """Describe this machine: cores, CPU model, memory, software versions, load."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        banner = subprocess.run(
            [find_mosquitto(), "-h"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        banner = "unknown"
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    names = ("aiomqtt", "paho-mqtt", "pydantic", "aiosqlite", "faststream")
    packages = {name: _version(name) for name in names}
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(memory_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mosquitto": banner.removeprefix("mosquitto version ").strip(),
        "packages": packages,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **speed(),
    }


def speed() -> dict[str, float]:
    """Time what every figure leans on, so that runs on different machines can be compared.

    python_loop_ms: a fixed pure-Python loop (best of 5); fsync_ms: the median of 200 fsyncs
    of one overwritten 4 KiB block in the temporary directory the figures write their ledgers to.
    """
    loops = []
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i & 7
        loops.append(time.perf_counter() - started)
    syncs = []
    with tempfile.TemporaryDirectory(prefix="vox-bench-speed-") as tmp:
        fd = os.open(Path(tmp) / "block", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
            for _ in range(200):
                os.pwrite(fd, b"x" * 4096, 0)
                started = time.perf_counter()
                os.fsync(fd)
                syncs.append(time.perf_counter() - started)
        finally:
            os.close(fd)
    return {
        "python_loop_ms": round(min(loops) * 1000, 1),
        "fsync_ms": round(statistics.median(syncs) * 1000, 3),
    }


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _verdict(row: dict[str, Any]) -> str:
    return {True: "met", False: "**not met**", None: "-"}[row.get("met")]


def figure_table(results: dict[str, Any]) -> list[str]:
    """Return the summary table: one line per measured row of every figure."""
    lines = [
        "| # | figure | unit | VOX | baseline | ratio | target | target met |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for name, entry in results["figures"].items():
        if "error" in entry:
            lines.append(f"| {entry['number']} | {name}: failed: {entry['error']} | | | | | | |")
            continue
        for row in entry["rows"]:
            lines.append(
                f"| {entry['number']} | {row['title']} | {row['unit']} | {_number(row['vox'])} "
                f"| {_number(row['baseline'])} | {_number(row['ratio'])} | {row['target']} "
                f"| {_verdict(row)} |"
            )
    return lines


def _raw_client(row: dict[str, Any], key: str) -> str:
    """Say which raw client the baseline ran on, and what each one measured (rawmqtt.py)."""
    by_client = row.get(key)
    if not by_client:
        return ""  # a run from before both raw clients were measured
    each = ", ".join(f"{name} {value}" for name, value in by_client.items())
    return f"; raw client: {row['baseline_client']}, the faster of ({each})"


def _details(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    row: dict[str, Any] | None  # each figure's first row, where it has one
    figures = results["figures"]
    for name in ("one_hop", "three_levels"):
        rows = _rows(figures, name)
        for row in rows:
            vox, raw = row["vox_detail"], row["baseline_detail"]
            lines.append(
                f"- **{row['title'].split(':')[0]}** ({vox['n']} round trips each): VOX p50 "
                f"{vox['p50_ms']} ms, p99 {vox['p99_ms']} ms, mean {vox['mean_ms']} ms; raw p50 "
                f"{raw['p50_ms']} ms, p99 {raw['p99_ms']} ms, mean {raw['mean_ms']} ms "
                f"(p99 ratio {row['p99_ratio']}){_raw_client(row, 'baseline_p50_ms_by_client')}."
            )
        floor = rows[0].get("obligations_detail") if rows else None
        if floor is not None:
            over = "; ".join(
                f"{r['vox_over_obligations']} x that floor ({_layout(r)})" for r in rows
            )
            lines.append(
                f"  - The same raw clients acknowledging every request (never an answer) "
                f"and committing "
                f"(synchronous=FULL) in the groups a VOX hop commits in: p50 "
                f"{floor['p50_ms']} ms, p99 {floor['p99_ms']} ms: "
                f"{rows[0]['obligations_ratio']} x raw, the price of the guarantees alone. "
                f"VOX is {over}."
            )
    for row in _rows(figures, "throughput"):
        vox, raw = row["vox_detail"], row["baseline_detail"]
        if "cpu_ms_per_command_agents" in vox:
            where = (
                f"{vox['cpu_ms_per_command_python']} ms in the {vox['agent_processes']} agent "
                f"processes and the operator's together (agents {vox['cpu_ms_per_command_agents']}"
                f" ms, operator and load generator {vox['cpu_ms_per_command_operator']} ms)"
            )
        else:
            where = f"{vox['cpu_ms_per_command_python']} ms in the agents' process"
        lines.append(
            f"- **{row['title'].split(':')[0]}** ({row['concurrency']} in flight, "
            f"{row['seconds']:g} s per side): CPU per command: VOX {where} "
            f"and {vox['cpu_ms_per_command_broker']} ms in Mosquitto; raw "
            f"{raw['cpu_ms_per_command_python']} ms and {raw['cpu_ms_per_command_broker']} ms. "
            f"CPU per VOX message (8 per command): {vox.get('cpu_ms_per_message_python')} ms, "
            f"per raw message (6 per command): {raw.get('cpu_ms_per_message_python')} ms: "
            f"{vox.get('cpu_per_message_ratio')} x (target <= 1.5 x). "
            f"Specialists served {vox['served_by_specialist']}"
            f"{_raw_client(row, 'baseline_rate_by_client')}."
        )
        floor = row.get("obligations_detail")
        if floor is not None:
            lines.append(
                f"  - The same raw clients acknowledging every request (never an answer) "
                f"and committing "
                f"(synchronous=FULL, grouped per turn of the loop) as a VOX hop must: "
                f"{floor['commands_per_second']} commands/s, {floor['cpu_ms_per_command_python']}"
                f" ms CPU per command: {row['obligations_ratio']} x raw, the price of the "
                f"guarantees alone. VOX is {row['vox_over_obligations']} x that floor."
            )
    row = _first(figures, "faststream")
    if row is not None:
        vox, fast = row["vox_detail"], row["baseline_detail"]
        lines.append(
            f"- **FastStream MQTT RPC** (one hop, pydantic handler, QoS 1, same broker): "
            f"FastStream p50 {fast['p50_ms']} ms, p99 {fast['p99_ms']} ms, "
            f"{fast['requests_per_second']:,} requests/s; VOX p50 {vox['p50_ms']} ms, p99 "
            f"{vox['p99_ms']} ms, {vox['requests_per_second']:,} requests/s (ratios "
            f"{vox['p50_ms'] / fast['p50_ms']:.2f} and "
            f"{vox['requests_per_second'] / fast['requests_per_second']:.2f})."
        )
        floor = row.get("obligations_detail")
        if floor is not None:
            lines.append(
                f"  - Raw clients acknowledging requests and committing as a VOX hop must "
                f"(synchronous=FULL, grouped per turn of the loop): p50 {floor['p50_ms']} ms, "
                f"{floor['requests_per_second']:,} requests/s "
                f"({floor['requests_per_second'] / fast['requests_per_second']:.2f} x "
                "FastStream's): the guarantees' own price."
            )
    for row in _rows(figures, "loaded"):
        vox, floor, raw = row["vox_detail"], row["baseline_detail"], row["raw_detail"]
        lines.append(
            f"- **{row['title'].split(':')[0]}** ({_layout(row)}, {vox['n']} round trips each, "
            f"a process spinning on one core): VOX p50 {vox['p50_ms']} ms, the floor "
            f"{floor['p50_ms']} ms, raw {raw['p50_ms']} ms: {row['ratio']} x the floor, "
            f"{row['vox_over_raw']} x raw."
        )
    row = _first(figures, "ledger")
    if row is not None:
        lines.append(f"- **Ledger** ({row['producers']} concurrent producers, synchronous=FULL):")
        for mode in row["modes"]:
            lines.append(
                f"  - {mode['mode']}: {mode['records_per_second']:,} records/s in "
                f"{mode['commits']} commits; one record alone: p50 {mode['p50_ms']} ms, "
                f"p99 {mode['p99_ms']} ms"
            )
    if "footprint" in figures and "rows" in figures["footprint"]:
        rows = figures["footprint"]["rows"]
        idle, fleet = rows[0]["detail"], rows[2]["vox_detail"]
        lines.append(
            f"- **Idle daemon**: RSS {idle['rss_mib_start']} -> {idle['rss_mib_end']} MiB "
            f"(USS {idle['uss_mib_end']} MiB), {idle['threads']} threads, "
            f"{idle['cpu_seconds']} s CPU in {idle['seconds']} s (heartbeat "
            f"{idle['heartbeat_interval']:g} s)."
        )
        lines.append(
            f"- **Fleet**: from starting {fleet['worker_processes']} worker processes until a "
            f"watching console saw every agent ACTIVE: {fleet['startup_seconds_until_all_active']}"
            f" s; the workers' RSS together: {fleet['workers_rss_mib']} MiB."
        )
    row = _first(figures, "render")
    if row is not None:
        steps = ", ".join(f"{k.removesuffix('_s')} {v} s" for k, v in row["steps"].items())
        lines.append(f"- **Render** ({row['identities']} identities): {steps}.")
    return lines


def _rows(figures: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Return the rows of a figure that ran (none if it failed or did not run)."""
    entry = figures.get(name)
    if entry is None or "rows" not in entry:
        return []
    rows: list[dict[str, Any]] = entry["rows"]
    return rows


def _layout(row: dict[str, Any]) -> str:
    """Return how a row of figures 1-3 ran its agents (results before layouts: all-in-one)."""
    return str(row.get("layout", "all-in-one"))


def _first(figures: dict[str, Any], name: str) -> dict[str, Any] | None:
    entry = figures.get(name)
    if entry is None or "rows" not in entry:
        return None
    row: dict[str, Any] = entry["rows"][0]
    return row


def _profile(results: dict[str, Any]) -> list[str]:
    profiled = [r for r in _rows(results["figures"], "throughput") if "profile" in r]
    if not profiled:
        return []
    profile = profiled[0]["profile"]
    lines = [
        "### Where the time goes (figure 3, cProfile of the event loop)",
        "",
        "A separate profiled run of the all-in-one VOX tree "
        f"({profile['commands_per_second_under_profiler']}"
        f" commands/s under the profiler): {profile['busy_seconds']} s busy in the event loop "
        f"thread, {profile['idle_seconds']} s waiting in epoll. The SQLite work itself runs in "
        "each ledger's writer thread and shows here only as the hand-offs to it.",
        "",
        "| area | own time (s) | share of busy |",
        "|---|---:|---:|",
    ]
    lines += [f"| {a['area']} | {a['seconds']} | {a['share']:.0%} |" for a in profile["areas"][:10]]
    lines += [
        "",
        "| function (top own time) | calls | own s | cumulative s |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{f['function']}` | {f['calls']} | {f['own_s']} | {f['cumulative_s']} |"
        for f in profile["top_own_time"][:12]
    ]
    lines += ["", "| vox_mqtt function (top cumulative) | calls | own s | cumulative s |"]
    lines += ["|---|---:|---:|---:|"]
    lines += [
        f"| `{f['function']}` | {f['calls']} | {f['own_s']} | {f['cumulative_s']} |"
        for f in profile["top_cumulative_vox"][:12]
    ]
    return lines


def _speed_line(m: dict[str, Any]) -> list[str]:
    if "python_loop_ms" not in m:
        return []
    return [
        "",
        f"Machine speed, to compare runs across machines: a fixed Python loop of a million "
        f"steps took {m['python_loop_ms']} ms and an fsync of one 4 KiB block {m['fsync_ms']} ms "
        "(bench/report.py `speed`).",
    ]


def markdown(results: dict[str, Any]) -> str:
    """Return BENCHMARKS.md for a run."""
    m = results["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        "# Benchmarks: VOX side by side with raw MQTT",
        "",
        f"Produced by `{results['command']}` on {results['date']} in "
        f"{results['seconds']:.0f} s{' (quick sizes)' if results['quick'] else ''}; the "
        f"agents' ledgers with ledger_sync = {results.get('ledger_sync', 'full')!r}"
        f"{' (synchronous=FULL)' if results.get('ledger_sync', 'full') == 'full' else ''}.",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}; Python {m['python']}, Mosquitto {m['mosquitto']}; {packages}. "
        f"Load average {m['load_average']} at the start and "
        f"{results['load_average_end']} at the end (other work shares this machine).",
        *_speed_line(m),
        "",
        "Every figure is measured in one run against its baseline on the same private Mosquitto,"
        " started from the rendered, ACL'd config (`set_tcp_nodelay true`; clients set "
        "TCP_NODELAY too), on loopback. The raw baseline logs in with the same identities and "
        "publishes on the same topics at QoS 1, awaiting each PUBACK; figure 13's baseline is "
        "FastStream's MQTT RPC instead (what a user would pick). Ratio = VOX / baseline. "
        "Benchmarks are not tests: a target not met is reported, never failed.",
        "",
        "Figures 1-3 run VOX in two layouts against the same raw baseline in the same run: "
        "all-in-one (every agent and the operator as VOXAgents in the bench's process) and "
        "process per agent (each agent a `vox-agent` daemon of its own, `python -m "
        "agent_daemon --config FILE` with a config rendered from the fleet, as on real hosts; "
        "the operator in the bench's process). docs/performance.md says what each measures.",
        "",
        "## Figures",
        "",
        *figure_table(results),
        "",
        "## Details",
        "",
        *_details(results),
        "",
        *_profile(results),
        "",
    ]
    if ANALYSIS.is_file():
        text = ANALYSIS.read_text(encoding="utf-8")
        body = text.split("\n", 1)[1] if text.startswith("# ") else text
        lines += ["## Analysis (from docs/performance.md)", "", body.strip(), ""]
    return "\n".join(lines)
