"""Reading a file a config names: a regular file of bounded size, or a one-line refusal.

A config and the files it names are read by a running agent on SIGHUP (docs/operations.md):
a FIFO there must not block the reader, and a device such as `/dev/zero` must not be read
into memory. The file is opened without blocking (`O_NONBLOCK`, so opening a FIFO returns at
once), looked at through its descriptor (`fstat`: what was checked is what is read), and read
only when it is a regular file within its bound; at most bound + 1 bytes are ever read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_SECRET_BYTES",
    "MAX_TLS_FILE_BYTES",
    "FileRefused",
    "check_regular",
    "read_regular",
]

MAX_CONFIG_BYTES: Final = 1024 * 1024  # a daemon or console config, a links file
MAX_SECRET_BYTES: Final = 64 * 1024  # a credentials file (password_file)
MAX_TLS_FILE_BYTES: Final = 1024 * 1024  # a CA, certificate or key file


class FileRefused(OSError):
    """The path is not a regular file, or is larger than its bound."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refusal(mode: int, size: int, limit: int) -> str | None:
    if not stat.S_ISREG(mode):
        return f"{_kind(mode)}, not a regular file"
    if size > limit:
        return f"{size} bytes, more than the {limit} a file here may hold"
    return None


def read_regular(path: Path, *, limit: int) -> bytes:
    """Return the bytes of a regular file of at most limit bytes.

    Raise FileNotFoundError / OSError as `open` does, FileRefused otherwise (never blocks on
    a FIFO, never reads more than limit + 1 bytes).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        why = _refusal(info.st_mode, info.st_size, limit)
        if why is not None:
            raise FileRefused(f"{path}: {why}")
        chunks: list[bytes] = []
        read = 0
        while read <= limit:
            chunk = os.read(fd, limit + 1 - read)
            if not chunk:
                break
            chunks.append(chunk)
            read += len(chunk)
        if read > limit:  # it grew after fstat
            raise FileRefused(f"{path}: more than the {limit} bytes a file here may hold")
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular(path: Path, *, limit: int) -> str | None:
    """Return why an existing path may not be used (not regular, too large), or None.

    A missing or unreadable path is left to whoever opens it (its own message says more).
    """
    try:
        info = os.stat(path)
    except OSError:
        return None
    why = _refusal(info.st_mode, info.st_size, limit)
    return None if why is None else f"{path}: {why}"
