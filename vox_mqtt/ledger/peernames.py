"""The names an agent knows (itself, its master, its children), kept beside its ledger.

`vox ledger` reads them to show names next to the ids of a ledger file, wherever the
file is read (docs/ledger.md). They are rewritten at every start, so they follow the
agent's config.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from uuid import UUID

__all__ = ["NAMES_FILE", "plain_name", "read_names", "write_names"]

NAMES_FILE = "names.json"
# The names a fleet file allows (docs/fleet-file.md): anything else in a names file is
# not one the agent wrote, and is left out rather than shown.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_MAX_BYTES = 4 * 1024 * 1024


def plain_name(value: object) -> str | None:
    """Return value when it is a name a fleet file allows, else None."""
    return value if isinstance(value, str) and _NAME.fullmatch(value) else None


def write_names(state_dir: Path, names: Mapping[UUID, str]) -> None:
    """Write {id: name} next to the ledger, atomically; an unwritable dir is left alone."""
    path = Path(state_dir) / NAMES_FILE
    text = json.dumps({str(k): v for k, v in names.items()}, indent=1, sort_keys=True)
    tmp = path.with_name(f".{NAMES_FILE}.tmp")
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return  # names are a convenience for people; the agent runs without them


def read_names(state_dir: Path) -> dict[UUID, str]:
    """Return the names kept beside a ledger, or {} when there are none."""
    path = Path(state_dir) / NAMES_FILE
    try:
        if not path.is_file() or path.stat().st_size > _MAX_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    names: dict[UUID, str] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            name = plain_name(value)
            if name is None:
                continue
            try:
                names[UUID(str(key))] = name
            except ValueError:
                continue
    return names
