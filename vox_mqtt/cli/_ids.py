"""Ids as people type them back: unique prefixes, and the names a file knows for them."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from vox_mqtt.protocol.errors import ConfigError, FleetError

from ._common import CONFIG_ENV

if TYPE_CHECKING:
    from vox_mqtt.protocol.hierarchy import Fleet

# The fleet tree and the ledger's names file load with the views that name agents:
# `vox request show` and `vox cancel` parse an id with this module and nothing more.

__all__ = [
    "MIN_PREFIX",
    "AmbiguousId",
    "Names",
    "names_for_ledger",
    "normalize_prefix",
    "pick_by_prefix",
]

MIN_PREFIX = 4  # fewer hex digits than this match too much to be meant
_HEX = re.compile(r"[0-9a-f]+")
# Where a daemon's config sits when its ledger is /var/lib/vox/NAME/logs.db (docs/deploy.md).
_ETC = Path("/etc/vox")


def normalize_prefix(text: str, what: str) -> str:
    """Return the canonical (lower-case, hyphenated) prefix of a UUID; raise ValueError."""
    raw = text.strip().lower()
    digits = raw.replace("-", "")
    if not digits or not _HEX.fullmatch(digits) or len(digits) > 32:
        raise ValueError(f"not a {what} (a UUID or the start of one): {text!r}")
    if len(digits) == 32:
        return str(UUID(digits))
    if len(digits) < MIN_PREFIX:
        raise ValueError(
            f"{what} {text!r} is too short: give at least {MIN_PREFIX} hex digits of it"
        )
    # Hyphens at the UUID's own places, so the prefix compares with str(UUID).
    cuts = (8, 12, 16, 20)
    parts, start = [], 0
    for cut in cuts:
        if len(digits) <= cut:
            break
        parts.append(digits[start:cut])
        start = cut
    parts.append(digits[start:])
    return "-".join(parts)


class AmbiguousId(ValueError):
    """A prefix that starts more than one id: the person has to give more of it."""


def pick_by_prefix(prefix: str, candidates: Iterable[str], what: str, where: str) -> str:
    """Return the one candidate starting with prefix; raise ValueError saying why not."""
    matches = sorted({c for c in candidates if c.startswith(prefix)})
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ValueError(f"no {what} starting with {prefix!r} in {where}")
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    raise AmbiguousId(
        f"{what} {prefix!r} is ambiguous in {where}: it starts {len(matches)} of them "
        f"({shown}); give more digits"
    )


class Names:
    """Agent names by id, from whatever files know them."""

    def __init__(self, known: dict[UUID, str] | None = None) -> None:
        self.known: dict[UUID, str] = dict(known or {})
        self.sources: list[str] = []  # where the names came from, for the views to say

    def provenance(self) -> str:
        """Return one line saying where the names shown came from ("" when none)."""
        if not self.known or not self.sources:
            return ""
        return "names from " + ", ".join(self.sources)

    def name(self, value: str | UUID | None) -> str:
        """Return the name of an id, or "" when no file names it."""
        if value is None:
            return ""
        try:
            return self.known.get(UUID(str(value)), "")
        except ValueError:
            return ""

    def label(self, value: str | UUID | None) -> str:
        """Return `name 1a2b3c4d` when the name is known, else the id's first 8 digits."""
        if value is None or value == "":
            return ""
        short = str(value)[:8]
        name = self.name(value)
        return f"{name} {short}" if name else short

    def add_file(self, path: Path) -> None:
        """Learn the names a fleet file, daemon config or console config holds."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError([f"{path}: cannot read names from it: {exc}"]) from None
        if "agents" in data:
            from vox_mqtt.protocol.hierarchy import load_fleet

            try:
                self.add_fleet(load_fleet(path))
            except FleetError as exc:
                raise ConfigError(exc.problems) from None
            self.sources.append(f"the fleet file {path}")
            return
        for section in ("agent", "operator"):
            table = data.get(section)
            if isinstance(table, dict):
                self._add_section(table)
        self.sources.append(f"the bundle {path}")

    def add_fleet(self, fleet: Fleet) -> None:
        """Learn every name of a fleet."""
        self.known[fleet.operator_id] = fleet.operator_name
        for agent in fleet:
            self.known[agent.id] = agent.name

    def _add_section(self, table: dict[str, Any]) -> None:
        pairs = [
            (table.get("id"), table.get("name")),
            (table.get("master_id"), table.get("master_name")),
            (table.get("root_id"), table.get("root_name")),
        ]
        children = table.get("children")
        if isinstance(children, dict):
            pairs += list(children.items())
        from vox_mqtt.ledger.peernames import plain_name

        for key, raw in pairs:
            name = plain_name(raw)
            if isinstance(key, str) and name is not None:
                try:
                    self.known[UUID(key)] = name
                except ValueError:
                    continue


def names_for_ledger(db: Path, given: Path | None) -> Names:
    """Return the names for a ledger's views: from --config only, or beside it and nearby.

    With --config (a fleet file or an operator's or agent's bundle) the names come from that
    file alone. Without it: the names.json the agent keeps beside its ledger (a file that
    travels with a copied ledger, so the views say they used it), $VOX_CONFIG,
    /etc/vox/NAME.toml for a ledger in a folder NAME (the unit's state directory), and
    NAME.toml next to a console's NAME-state folder. A file that is missing or unreadable
    there only means fewer names. Only names a fleet file allows are taken.
    """
    from vox_mqtt.ledger.peernames import NAMES_FILE, read_names

    folder = db.absolute().parent
    if given is not None:
        names = Names()
        names.add_file(given)
        return names
    names = Names(read_names(folder))  # what the agent wrote beside its ledger at start
    if names.known:
        names.sources.append(
            f"{folder / NAMES_FILE} (kept beside the ledger; --config FLEET for the fleet's)"
        )
    candidates = [_ETC / f"{folder.name}.toml"]
    if folder.name.endswith("-state"):
        candidates.append(folder.parent / f"{folder.name.removesuffix('-state')}.toml")
    env = os.environ.get(CONFIG_ENV, "").strip()
    if env:
        candidates.append(Path(env))
    for candidate in candidates:
        if candidate.is_file():
            try:
                names.add_file(candidate)
            except ConfigError:
                continue
    return names
