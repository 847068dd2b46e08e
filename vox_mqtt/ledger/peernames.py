"""The names an agent knows (itself, its master, its children), kept beside its ledger.

`vox ledger` reads them to show names next to the ids of a ledger file, wherever the
file is read (docs/ledger.md). They are rewritten at every start, so they follow the
agent's config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from uuid import UUID

__all__ = ["NAMES_FILE", "read_names", "write_names"]

NAMES_FILE = "names.json"


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
    try:
        data = json.loads((Path(state_dir) / NAMES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    names: dict[UUID, str] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            try:
                names[UUID(str(key))] = str(value)
            except ValueError:
                continue
    return names
