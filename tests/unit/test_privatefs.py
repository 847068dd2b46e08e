"""privatefs: state directories 0700 and ledger files 0600 whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vox_mqtt.ledger.privatefs import private_dir, private_file


def test_new_and_existing_paths_become_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        state = tmp_path / "a" / "state"
        private_dir(state)
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        ledger = state / "logs.db"
        ledger.write_bytes(b"x")  # 0644 under this umask
        private_file(ledger)
        assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
        assert ledger.read_bytes() == b"x"  # never truncated
        loose = tmp_path / "loose"
        loose.mkdir(mode=0o755)
        private_dir(loose)
        assert stat.S_IMODE(loose.stat().st_mode) == 0o700
    finally:
        os.umask(old)
