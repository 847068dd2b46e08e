"""Prove which rules a running broker enforces: the reload canary's two publishes.

After a reload, a publish the new rules allow must be acknowledged with 0x00 (or
0x10, no subscribers) and one no rule allows must be refused with 0x87. A broker
that runs with no ACL passes the first and fails the second; one that still holds
the old rules, or lost the canary's block, fails the first (docs/broker.md).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Final

from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.protocol.errors import BrokerUnavailable, Refused
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.blocking import BlockingSession
from vox_mqtt.transport.outcome import NOT_AUTHORIZED

__all__ = ["ProbeResult", "alive", "one_shot_settings", "probe_rules", "watch_broker"]

_ALLOWED: Final = frozenset({0x00, 0x10})
_ATTEMPT_TIMEOUT: Final = 3.0
_WATCH_STEP: Final = 0.25


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """What the canary saw: ok, or the reason the rules in force are not the rendered ones."""

    ok: bool
    reason: str


def alive(pid: int) -> bool:
    """Return whether the process is still there (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Tell whether a process exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def one_shot_settings(creds: Credentials, timeout: float) -> BrokerSettings:
    """Return how a tool on the broker host logs in as creds: one attempt, no session kept."""
    return creds.broker_settings(
        keepalive=10,
        session_expiry=0,  # nothing is left on the broker when it leaves
        connect_timeout=timeout,
        publish_timeout=timeout,
    )


def _attempt(creds: Credentials, allowed: str, forbidden: str) -> tuple[bool, str]:
    """Return (rules proven, what was seen) for one canary session."""
    try:
        with BlockingSession(one_shot_settings(creds, _ATTEMPT_TIMEOUT)) as canary:
            ok = canary.publish(allowed, b"").code
            bad = canary.publish(forbidden, b"").code
    except Refused as exc:
        return False, f"the canary's login was refused: {exc}"
    except BrokerUnavailable:
        # Nothing listens, or a stopped broker's kernel took the connection and nobody sent
        # its CONNACK within _ATTEMPT_TIMEOUT: either way, no answer (probe_rules retries).
        return False, f"no answer from {creds.host}:{creds.port}"
    seen = f"allowed publish -> {_code(ok)}, forbidden publish -> {_code(bad)}"
    if bad is not None and bad != NOT_AUTHORIZED:
        return False, f"{seen}: the broker enforces NO ACL"
    if ok not in _ALLOWED:
        return False, f"{seen}: the rendered rules are not in force"
    if bad is None:
        return False, seen
    return True, seen


def _code(value: int | None) -> str:
    return "none" if value is None else f"0x{value:02x}"


def probe_rules(
    creds: Credentials, *, allowed: str, forbidden: str, pid: int | None, timeout: float
) -> ProbeResult:
    """Retry the canary until the rules are proven or timeout; fail at once if pid dies."""
    deadline = time.monotonic() + timeout
    seen = "no attempt"
    while True:
        if pid is not None and not alive(pid):
            return ProbeResult(ok=False, reason=f"the broker (pid {pid}) died")
        ok, seen = _attempt(creds, allowed, forbidden)
        if ok:
            # A crash can follow the reload by a moment: look once more.
            if pid is None or alive(pid):
                return ProbeResult(ok=True, reason=seen)
            return ProbeResult(ok=False, reason=f"the broker (pid {pid}) died")
        if "NO ACL" in seen or time.monotonic() > deadline:
            return ProbeResult(ok=False, reason=seen)
        time.sleep(0.1)


def _refuses(host: str, port: int) -> bool:
    """Return whether host:port refuses a TCP connection (nothing listens there)."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False  # slow or unreachable for another reason: not a proof of a crash


def watch_broker(
    pid: int | None, endpoints: tuple[tuple[str, int], ...], seconds: float
) -> str | None:
    """Watch a broker for `seconds`; return what went wrong, or None if it stayed up.

    A crash after a proven reload is the process gone or a listener refusing
    connections (docs/broker.md, "Watching after a reload"). A listener that is
    only slow to accept is not counted: a busy broker is not a crashed one.
    """
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if pid is not None and not alive(pid):
            return f"the broker (pid {pid}) died {elapsed:.1f} s after the reload"
        for host, port in endpoints:
            if _refuses(host, port):
                return f"{host}:{port} refused connections {elapsed:.1f} s after the reload"
        if elapsed >= seconds:
            return None
        time.sleep(min(_WATCH_STEP, max(0.0, seconds - elapsed)))
