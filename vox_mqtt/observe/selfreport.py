"""What an agent says of itself in its status: its connection epoch and its host's figures.

The sender's side of a status (docs/liveness.md); observe/status.py is the reader's.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["EpochCounter", "host_metrics"]

log = logging.getLogger("vox_mqtt.liveness")

_PROCESS_STARTED = time.time()
_PROCESS = psutil.Process()
# The host's and this process's figures are read at most once per this window and shared
# by every agent the process hosts (a worker of a thousand agents reads /proc once a
# second, not a thousand times per heartbeat). It also keeps the CPU figures meaningful:
# they are "since the previous reading", and two readings a few ms apart (a birth and an
# advertisement update) would say 0 or 100.
_SHARED_WINDOW = 1.0
_shared: dict[str, Any] = {"at": -math.inf, "figures": {}}


def _forked() -> None:
    global _PROCESS
    _PROCESS = psutil.Process()  # the child's own, not its parent's
    _shared["at"] = -math.inf


os.register_at_fork(after_in_child=_forked)


def _shared_figures() -> dict[str, float]:
    """Return the host's and this process's figures, read at most once per _SHARED_WINDOW."""
    now = time.monotonic()
    if now - _shared["at"] >= _SHARED_WINDOW:
        load1, _, _ = os.getloadavg()
        _shared["at"] = now
        _shared["figures"] = {
            "cpu_percent": psutil.cpu_percent(interval=None),
            "memory_percent": psutil.virtual_memory().percent,
            "load_1m": round(load1, 2),
            "process_rss_bytes": _PROCESS.memory_info().rss,
            "process_cpu_percent": _PROCESS.cpu_percent(interval=None),
            "uptime_s": round(time.time() - psutil.boot_time()),
        }
    figures: dict[str, float] = _shared["figures"]
    return figures


def host_metrics(state_dir: Path | str = "/") -> dict[str, Any]:
    """Return this host's and process's health figures (psutil), cheap enough per heartbeat.

    The host's and the process's are shared by the agents of one process (read at most once
    a second); the disk is the agent's own state dir's.
    """
    shared = _shared_figures()
    try:
        disk = psutil.disk_usage(str(state_dir)).percent
    except OSError:
        disk = 0.0
    return {
        # Since the previous reading: at most the heartbeat interval, at least a second.
        "cpu_percent": shared["cpu_percent"],
        "memory_percent": shared["memory_percent"],
        "disk_percent": disk,
        "load_1m": shared["load_1m"],
        "process_rss_bytes": shared["process_rss_bytes"],
        "process_cpu_percent": shared["process_cpu_percent"],
        "uptime_s": shared["uptime_s"],
        "process_uptime_s": round(time.time() - _PROCESS_STARTED, 1),
    }


class EpochCounter:
    """A per-connection counter persisted in the state dir (Sparkplug's bdSeq, for VOX)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "epoch"
        self.value = self._read()

    def _read(self) -> int:
        try:
            return max(0, int(self.path.read_text().strip()))
        except (FileNotFoundError, ValueError):
            return 0

    def next(self) -> int:
        """Advance the counter durably and return the new epoch."""
        self.value = max(self.value, self._read()) + 1
        tmp = self.path.with_suffix(".tmp")
        try:
            with tmp.open("w") as handle:
                handle.write(f"{self.value}\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            # A full disk must not keep the agent off the broker: this run counts on in
            # memory, and the next write that succeeds carries the count on.
            log.warning("epoch %d kept in memory only: cannot write %s: %s", self.value, tmp, exc)
        return self.value
