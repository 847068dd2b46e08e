"""Where the operator's console lives, and the lock that makes it the only one.

Stdlib only: the thin clients import this module, and every import costs each verb time
(docs/operations.md, "The operator's console").

The console's socket, lock and log sit in the operator's state dir (0700, docs/security.md):
only the operator's user can reach the socket at all, and the console checks each peer's
credentials on top (`peer_allowed`). The lock (`OperatorLock`, an flock) is held by whichever
process is the operator now, the console or a `--one-shot` verb, so no two of them ever log
in as the operator at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
from pathlib import Path
from typing import Final

__all__ = [
    "IDLE_DEFAULT",
    "LOCK_NAME",
    "LOG_NAME",
    "SOCKET_NAME",
    "OperatorLock",
    "connectable",
    "idle_expired",
    "peer_allowed",
    "peer_uid",
]

SOCKET_NAME: Final = "console.sock"
LOCK_NAME: Final = "console.lock"
LOG_NAME: Final = "console.log"
# How long a console a verb started stays up after its last client (ssh's ControlPersist):
# long enough for a person's next few commands, short enough not to linger for a day.
IDLE_DEFAULT: Final = 600.0
# A Unix socket path longer than this does not fit in sockaddr_un (108 bytes with the NUL).
_SUN_PATH: Final = 107
_UCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_allowed(peer: int | None, own: int) -> bool:
    """Return whether a peer of the socket with this uid may use the console.

    Only the operator's own user: the socket's mode already keeps others out, this is the
    second lock on the same door (a socket passed on, a directory made wider by mistake).
    An unknown peer (no credentials) is refused.
    """
    return peer is not None and peer == own


def peer_uid(sock: socket.socket) -> int | None:
    """Return the uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return int(uid)


def idle_expired(idle: float | None, clients: int, last_active: float, now: float) -> bool:
    """Return whether a console should stop: no client for `idle` seconds (None: never)."""
    return idle is not None and clients == 0 and now - last_active >= idle


def connectable(path: Path) -> str:
    """Return a path string that reaches the socket at path, short enough for sockaddr_un.

    A state dir deep in a home or a temporary tree can make the socket's path too long for
    bind and connect; then the path is taken through /proc/self/fd of its open folder, whose
    name is short whatever the folder's is (Linux). The folder's descriptor is left open for
    the life of the process: the path names it.
    """
    text = str(path)
    if len(text.encode()) <= _SUN_PATH:
        return text
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{path.name}"


class OperatorLock:
    """An exclusive flock on the state dir's console.lock, with the holder's pid inside."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if nobody holds it; return whether this process holds it now."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """Return the pid written by the process that holds (or last held) the lock."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text(encoding="ascii").strip())
        return None

    def held(self) -> bool:
        """Return whether some process holds the lock now (this one included)."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        """Let the lock go (closing the file is what frees an flock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
