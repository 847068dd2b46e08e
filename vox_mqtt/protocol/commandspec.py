"""What a command takes, as its advertisement carries it: a doc line and a JSON schema.

An agent's status may carry `params`: for each command it advertises, `{"doc": ...,
"schema": {...}}`, the handler's docstring's first paragraph and the JSON schema of its
keyword parameters (docs/liveness.md, "Parameter schemas"). These are the bounds both
sides keep: the agent when it builds an entry, its master when it takes a child's.
Pure functions, no state.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

__all__ = [
    "MAX_DOC",
    "MAX_PARAMS_ENTRY",
    "PARAMS_BUDGET",
    "bounded_entry",
    "canonical_size",
    "first_paragraph",
    "taken_params",
    "within_budget",
]

# One command's entry, as canonical JSON (sorted keys, no spaces, UTF-8): larger, its
# schema is left out and the doc alone is carried.
MAX_PARAMS_ENTRY: Final = 2048
# The doc: the docstring's first paragraph, cut to this many characters.
MAX_DOC: Final = 300
# Every entry of one status together: a master's own first, then its children's in turns;
# what does not fit is carried as its doc alone, else not at all (its command still listed).
PARAMS_BUDGET: Final = 64 * 1024


def canonical_size(value: Any) -> int:
    """Return the size in bytes of a JSON value written canonically (the bound's measure)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode())


def first_paragraph(doc: str | None) -> str:
    """Return a docstring's first paragraph on one line, at most MAX_DOC characters."""
    if not doc:
        return ""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())[:MAX_DOC]


def bounded_entry(doc: str, schema: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """Return a command's entry within MAX_PARAMS_ENTRY, and whether its schema was left out."""
    entry: dict[str, Any] = {"doc": first_paragraph(doc)}
    if schema is None:
        return entry, False
    whole = {**entry, "schema": dict(schema)}
    if canonical_size(whole) <= MAX_PARAMS_ENTRY:
        return whole, False
    return entry, True


def _entry_problem(entry: Any) -> bool:
    if not isinstance(entry, dict) or set(entry) - {"doc", "schema"}:
        return True
    doc = entry.get("doc", "")
    if not isinstance(doc, str) or len(doc) > MAX_DOC:
        return True
    if "schema" in entry and not isinstance(entry["schema"], dict):
        return True
    return canonical_size(entry) > MAX_PARAMS_ENTRY


def taken_params(raw: Any, commands: Collection[str]) -> dict[str, dict[str, Any]]:
    """Return the entries a watcher keeps of a status's `params`: for listed commands only.

    An entry out of bounds (not `{"doc", "schema"}`, a doc too long, over MAX_PARAMS_ENTRY)
    is dropped, never a reason to refuse the status: only a client's form hangs on it.
    """
    if not isinstance(raw, dict):
        return {}
    listed = set(commands)
    return {
        command: entry
        for command, entry in raw.items()
        if command in listed and not _entry_problem(entry)
    }


def within_budget(
    entries: Iterable[tuple[str, Mapping[str, Any]]], budget: int = PARAMS_BUDGET
) -> tuple[dict[str, dict[str, Any]], int]:
    """Return the entries that fit the budget, in the order given, and how many were cut.

    An entry that does not fit whole is carried as its doc alone when that fits; else not
    at all. A command named twice keeps its first entry.
    """
    kept: dict[str, dict[str, Any]] = {}
    used = 2  # the braces of the object
    cut = 0
    for command, entry in entries:
        if command in kept:
            continue
        for candidate in (dict(entry), {"doc": entry.get("doc", "")}):
            size = canonical_size({command: candidate})  # its key and punctuation too
            if used + size <= budget:
                kept[command] = candidate
                used += size
                break
        if kept.get(command) != dict(entry):
            cut += 1
    return kept, cut
