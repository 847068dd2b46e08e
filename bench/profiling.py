"""Where the time goes: a cProfile of the event loop, summarised by area and by function."""

from __future__ import annotations

import cProfile
import pstats
import re
from collections import defaultdict
from typing import Any

# Waiting, not working: the selector's poll is where an idle event loop sleeps.
_IDLE = re.compile(r"method 'poll' of 'select\.epoll'|method 'select' of|_run_once.*select")
_SITE = re.compile(r"site-packages/([A-Za-z0-9_]+)")
_STDLIB = re.compile(r"python3\.\d+/([A-Za-z0-9_]+)")


def area_of(filename: str, function: str) -> str:
    """Name the library or module a profiled function belongs to."""
    if filename == "~":  # a built-in: guess its owner from its name
        if "pydantic" in function or "Schema" in function or "model_" in function:
            return "pydantic (validation, serialization)"
        if "sqlite" in function:
            return "sqlite3"
        if "sha256" in function or "hashlib" in function:
            return "hashlib"
        if "socket" in function or "recv" in function or "send" in function:
            return "socket I/O"
        if "json" in function or "encode" in function or "decode" in function:
            return "json"
        return "built-ins"
    if "/vox_mqtt/" in filename:
        return "vox_mqtt." + filename.rsplit("/", 1)[-1].removesuffix(".py")
    if "/bench/" in filename:
        return "bench (load generator)"
    if match := _SITE.search(filename):
        name = match.group(1)
        return {"paho": "paho-mqtt", "pydantic_core": "pydantic", "aiomqtt": "aiomqtt"}.get(
            name, name
        )
    if match := _STDLIB.search(filename):
        return match.group(1)
    return "other"


def _short(filename: str) -> str:
    """Return a file name as it reads on any machine: within the repository or the library."""
    for marker in ("site-packages/", "lib/python3.11/"):
        filename = filename.split(marker)[-1]
    for package in ("vox_mqtt/", "bench/", "agent_daemon/", "examples/"):
        if f"/{package}" in filename:
            return package + filename.rsplit(f"/{package}", 1)[-1]
    return filename


def summarize(profile: cProfile.Profile, top: int = 15) -> dict[str, Any]:
    """Return busy time by area and the functions with the most own time (idle excluded)."""
    stats = pstats.Stats(profile)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    areas: dict[str, float] = defaultdict(float)
    functions = []
    idle = 0.0
    for (filename, line, function), (_, ncalls, tottime, cumtime, _) in raw.items():
        label = f"{_short(filename)}:{line}"
        label = f"{function} ({label})" if filename != "~" else function
        if _IDLE.search(function):
            idle += tottime
            continue
        areas[area_of(filename, function)] += tottime
        functions.append((tottime, cumtime, ncalls, label))
    busy = sum(areas.values())
    # One call of the event loop's _run_once per turn of the loop.
    turns = sum(
        ncalls
        for (filename, _, function), (_, ncalls, _, _, _) in raw.items()
        if function == "_run_once" and filename.endswith("asyncio/base_events.py")
    )
    functions.sort(reverse=True)
    by_cumulative = sorted(
        (f for f in functions if "vox_mqtt/" in f[3]),
        key=lambda f: f[1],
        reverse=True,
    )
    return {
        "busy_seconds": round(busy, 3),
        "idle_seconds": round(idle, 3),
        "loop_turns": turns,
        "areas": [
            {"area": name, "seconds": round(sec, 3), "share": round(sec / busy, 3)}
            for name, sec in sorted(areas.items(), key=lambda item: -item[1])[:top]
        ],
        "top_own_time": [
            {"function": label, "calls": calls, "own_s": round(own, 3), "cumulative_s": round(c, 3)}
            for own, c, calls, label in functions[:top]
        ],
        "top_cumulative_vox": [
            {"function": label, "calls": calls, "own_s": round(own, 3), "cumulative_s": round(c, 3)}
            for own, c, calls, label in by_cumulative[:top]
        ],
    }
