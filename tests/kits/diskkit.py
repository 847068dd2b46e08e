"""A real full disk: a small tmpfs mounted for a test, and filling it to the last byte."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["NEEDS_MOUNT", "fill", "small_tmpfs"]

# Mounting needs root (the suite's machines run it as root; elsewhere these tests say why).
NEEDS_MOUNT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="mounting a small filesystem for the full disk needs root",
)


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str = "8m") -> Iterator[Path]:
    """Mount a real filesystem of `size` (tmpfs) at mount for the block; unmount it after."""
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill the filesystem to 100 % in one go; return the file that holds the space."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        for size in (1 << 20, 512):  # whatever a whole chunk did not fit into goes too
            try:
                while handle.write(b"\0" * size):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    assert shutil.disk_usage(disk).free < 4096
    return filler
