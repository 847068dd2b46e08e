"""sd_notify(3) over $NOTIFY_SOCKET: READY, WATCHDOG, STATUS, STOPPING, without libsystemd."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["Notifier", "watchdog_interval"]

log = logging.getLogger("agent_daemon.sdnotify")


class Notifier:
    """Send state lines to the service manager; silently a no-op outside systemd."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        self._warned = False
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        """Return whether a service manager listens."""
        return self._sock is not None

    def notify(self, *lines: str) -> bool:
        """Send `KEY=value` lines in one datagram; return whether it was sent."""
        if self._sock is None or self.address is None or not lines:
            return False
        # One datagram per state change, newline-separated, as sd_notify does; a
        # newline inside a value would start a bogus assignment.
        payload = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            self._sock.sendto(payload, self.address)
        except OSError as exc:
            # The manager going away must never take the agent down; say it once.
            if not self._warned:
                log.warning("cannot notify the service manager at %s: %s", self.address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        """Tell the manager start-up is complete (READY=1) with a status line."""
        return self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        """Set the free-text status `systemctl status` shows."""
        return self.notify(f"STATUS={status}")

    def watchdog(self) -> bool:
        """Ping the watchdog (WATCHDOG=1)."""
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time to start or stop (EXTEND_TIMEOUT_USEC)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def reloading(self) -> bool:
        """Say a reload (SIGHUP) is in progress."""
        return self.notify("RELOADING=1")

    def stopping(self, status: str) -> bool:
        """Say the service is stopping (STOPPING=1)."""
        return self.notify("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(value: str) -> str | bytes | None:
    """Turn $NOTIFY_SOCKET into a socket address; '@' means the abstract namespace."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # unset, or a vsock address this daemon does not speak


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Return the watchdog timeout in seconds if it applies to this process, else None."""
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    # A WATCHDOG_PID naming another process means the variables were inherited.
    if pid and pid != str(os.getpid()):
        return None
    return usec / 1_000_000
