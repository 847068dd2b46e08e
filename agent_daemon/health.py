"""The daemon's health: what it is (pure), the file it keeps, and what `--health` reads.

The running daemon says its health in systemd's status line and in `<state_dir>/health.json`,
rewritten at every check of its monitor; `vox-agent --config FILE --health`, a second
process, reads that file (docs/deploy.md, "Health").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "HEALTH_FILE",
    "Health",
    "assess",
    "read_health",
    "status_line",
    "write_health",
]

HEALTH_FILE: Final = "health.json"
# Every write has this size, so on a full disk it can overwrite the file in place (no new
# block needed) when a new file cannot be created: the state it then reports is the full
# disk itself.
_SIZE: Final = 1024
_READ_TRIES: Final = 3


@dataclass(frozen=True, kw_only=True)
class Health:
    """One reading of the daemon's health."""

    state: str  # "connected", "degraded", "disconnected", "starting", "stopping", "stopped"
    ledger: str  # "ok", or "unavailable: <why>"
    text: str  # one line for a person

    @property
    def ok(self) -> bool:
        """Return whether the daemon serves: connected and able to record."""
        return self.state == "connected"


def assess(*, phase: str, connected: bool, ledger_failure: str | None, broker: str) -> Health:
    """Return the daemon's health from what it knows now (a pure function).

    phase: "starting" (not on the broker yet), "serving", "stopping" or "stopped".
    """
    ledger = "ok" if ledger_failure is None else f"unavailable: {ledger_failure}"
    if phase == "starting":
        return Health(state="starting", ledger=ledger, text=f"starting: connecting to {broker}")
    if phase in ("stopping", "stopped"):
        return Health(state=phase, ledger=ledger, text=phase)
    if not connected:
        text = f"disconnected: broker at {broker} lost; reconnecting, ledger {ledger}"
        return Health(state="disconnected", ledger=ledger, text=text)
    if ledger_failure is not None:
        # It accepts no work it could not record (docs/liveness.md, DEGRADED).
        text = f"degraded: connected to {broker}, ledger {ledger}"
        return Health(state="degraded", ledger=ledger, text=text)
    return Health(state="connected", ledger=ledger, text=f"connected to {broker}, ledger ok")


def status_line(health: Health, serving: str) -> str:
    """Return systemd's STATUS= line: the health first, then what the daemon serves."""
    return f"{health.text}; {serving}" if health.state in ("connected", "degraded") else health.text


def _body(health: Health, *, now: float, valid_for: float, pid: int) -> bytes:
    for cut in (400, 120, 40):  # escaped characters take up to 12 bytes each
        fields: dict[str, Any] = {
            "state": health.state,
            "ok": health.ok,
            "ledger": health.ledger[: cut * 3 // 4],
            "text": health.text[:cut],
            "written_at": round(now, 3),
            "valid_for": valid_for,
            "pid": pid,
        }
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        data = json.dumps({**fields, "check": digest}, sort_keys=True).encode()
        if len(data) < _SIZE:
            break
    return data.ljust(_SIZE - 1) + b"\n"


def write_health(
    state_dir: Path, health: Health, *, valid_for: float, now: float | None = None
) -> bool:
    """Replace the health file atomically (in place when the disk is full); False if neither."""
    path = Path(state_dir) / HEALTH_FILE
    data = _body(
        health, now=time.time() if now is None else now, valid_for=valid_for, pid=os.getpid()
    )
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    try:
        # No room for a new file: the old one's blocks take the same number of bytes.
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pwrite(fd, data, 0) == len(data)
    except OSError:
        return False
    finally:
        os.close(fd)


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    check = data.pop("check", None)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return data if check == digest else None


def read_health(state_dir: Path, *, now: float | None = None) -> tuple[bool, str]:
    """Return (healthy, one line) from the health file a running daemon keeps."""
    path = Path(state_dir) / HEALTH_FILE
    data = None
    for _ in range(_READ_TRIES):  # an in-place rewrite may be caught half-way: read again
        try:
            data = _parse(path.read_bytes())
        except FileNotFoundError:
            return False, f"no health file {path}: the daemon has not started (or never ran here)"
        except OSError as exc:
            return False, f"cannot read {path}: {exc.strerror}"
        if data is not None:
            break
        time.sleep(0.05)
    if data is None:
        return False, f"{path} is not a health file the daemon wrote"
    at = float(data.get("written_at", 0.0))
    age = (time.time() if now is None else now) - at
    limit = float(data.get("valid_for", 0.0))
    if age > limit:
        return False, f"stale: {data.get('text')} (written {age:.0f}s ago, at most {limit:g}s)"
    return bool(data.get("ok")) and data.get("state") == "connected", str(data.get("text"))
