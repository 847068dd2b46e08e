"""Prove which rules a running broker enforces: the reload canary's two publishes.

After a reload, a publish the new rules allow must be acknowledged with 0x00 (or
0x10, no subscribers) and one no rule allows must be refused with 0x87. A broker
that runs with no ACL passes the first and fails the second; one that still holds
the old rules, or lost the canary's block, fails the first (docs/broker.md).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from vox_mqtt.broker.passwd import Credentials

__all__ = ["ProbeResult", "alive", "probe_rules", "watch_broker"]

_ALLOWED: Final = frozenset({0x00, 0x10})
_NOT_AUTHORIZED: Final = 0x87
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


class _Canary:
    """One short MQTT v5 session that reports CONNACK and PUBACK reason codes."""

    def __init__(self, creds: Credentials) -> None:
        self._cond = threading.Condition()
        self._connack: int | None = None
        self._acks: dict[int, int] = {}
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=creds.username,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        self._client.username_pw_set(creds.username, creds.password)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish
        self._creds = creds

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        with self._cond:
            self._connack = int(rc.value)
            self._cond.notify_all()

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        with self._cond:
            if self._connack is None:
                self._connack = int(rc.value) or _NOT_AUTHORIZED
            self._cond.notify_all()

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        with self._cond:
            self._acks[mid] = int(rc.value)
            self._cond.notify_all()

    def connect(self) -> int | None:
        """Return the CONNACK code, or None when the broker did not answer."""
        try:
            self._client.connect(self._creds.host, self._creds.port, keepalive=10)
        except OSError:
            return None
        self._client.loop_start()
        with self._cond:
            self._cond.wait_for(lambda: self._connack is not None, _ATTEMPT_TIMEOUT)
            return self._connack

    def publish(self, topic: str) -> int | None:
        """Publish an empty QoS 1 message; return the PUBACK code, None without one."""
        mid = self._client.publish(topic, b"", qos=1).mid
        with self._cond:
            self._cond.wait_for(lambda: mid in self._acks, _ATTEMPT_TIMEOUT)
            return self._acks.get(mid)

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()


def _attempt(creds: Credentials, allowed: str, forbidden: str) -> tuple[bool, str]:
    """Return (rules proven, what was seen) for one canary session."""
    canary = _Canary(creds)
    try:
        connack = canary.connect()
        if connack is None:
            return False, f"no answer from {creds.host}:{creds.port}"
        if connack != 0:
            return False, f"the canary's login was refused (CONNACK 0x{connack:02x})"
        ok = canary.publish(allowed)
        bad = canary.publish(forbidden)
    finally:
        canary.close()
    seen = f"allowed publish -> {_code(ok)}, forbidden publish -> {_code(bad)}"
    if bad is not None and bad != _NOT_AUTHORIZED:
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
