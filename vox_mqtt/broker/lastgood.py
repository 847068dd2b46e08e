"""The broker files the running broker last loaded, kept so a failed reload can go back.

`vox broker render` overwrites the files in place, so the previous ones must be kept
before that: render seeds `last-good/` once (the files the broker started with), and
every verified reload replaces it with what it just proved (docs/broker.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from vox_mqtt.broker.passwd import atomic_write

__all__ = ["LAST_GOOD", "keep_last_good", "restore_last_good", "seed_last_good"]

LAST_GOOD: Final = "last-good"
# What SIGHUP makes Mosquitto re-read, and what the dynsec plugin was last given.
_BROKER_FILES: Final = ("acl", "passwd", "dynsec.json")


def _store(root: Path) -> Path:
    store = root / LAST_GOOD
    store.mkdir(mode=0o700, exist_ok=True)
    return store


def keep_last_good(root: Path, names: Iterable[str] = _BROKER_FILES) -> None:
    """Copy the live broker files into last-good/ (the invoker's, 0600)."""
    store = _store(root)
    for name in names:
        live = root / name
        if live.exists():
            atomic_write(store / name, live.read_bytes(), mode=0o600)
        else:
            (store / name).unlink(missing_ok=True)


def seed_last_good(root: Path) -> None:
    """Keep the live files before the first render overwrites them; later renders keep none."""
    if (root / LAST_GOOD).is_dir():
        return
    if any((root / name).exists() for name in _BROKER_FILES):
        keep_last_good(root)


def restore_last_good(root: Path, names: Iterable[str]) -> list[str]:
    """Put the kept files back in place with the live files' owner; return what was restored."""
    store = root / LAST_GOOD
    restored = []
    for name in names:
        kept, live = store / name, root / name
        if not kept.exists():
            continue
        st = live.stat() if live.exists() else None
        owner = None if st is None or os.geteuid() != 0 else (st.st_uid, st.st_gid)
        mode = 0o600 if st is None else st.st_mode & 0o777
        atomic_write(live, kept.read_bytes(), mode=mode, owner=owner)
        restored.append(name)
    return restored
