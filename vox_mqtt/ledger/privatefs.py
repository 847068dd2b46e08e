"""State that is nobody else's business: directories 0700, ledger files 0600.

Under systemd the unit's StateDirectory is already private; elsewhere (a daemon run by
hand, tests, `vox demo`) the umask would leave state 0755 and the ledger 0644, readable
by every local user. SQLite gives its -wal and -shm files the database's own mode.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["private_dir", "private_file"]


def _tighten(path: Path, mode: int) -> None:
    st = path.stat()
    # Only our own path, and only looser than wanted: a shared parent stays as it is.
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, mode)


def private_dir(path: Path) -> None:
    """Create path (parents as the umask says) and make it 0700 if it is ours."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _tighten(path, 0o700)


def private_file(path: Path) -> None:
    """Create path empty if missing, and make it 0600 if it is ours."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    _tighten(path, 0o600)
