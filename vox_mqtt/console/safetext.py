"""Text from agents, messages and files, made safe to show in the operator's views.

Every string a view did not write itself (an agent's name, error code or version, a
war-room description, a notification's `message_source` or `note_to_human`, a row of a
ledger, a name from a file) passes through here before it reaches a terminal:

- `plain` turns it into one line of printable text: control characters (C0, DEL, C1),
  Unicode format characters (bidirectional overrides, zero-width) and line or paragraph
  separators are written as escapes (`\\x1b`, `\\u202e`, `\\n`), so no terminal sequence
  (a window title, an OSC 52 clipboard write, cursor movement) is ever interpreted;
- `shown` does that and escapes rich markup too, for a value put inside a markup string
  (`[/]` is shown as `[/]`, never read as a tag).

docs/liveness.md ("What the views show") says what the operator sees.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_SHOWN", "plain", "shown"]

# No value from outside is shown longer than this many characters (then "…").
MAX_SHOWN: Final = 2000
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    # Cc: control characters; Cf: format characters (bidi overrides, zero width);
    # Zl/Zp: line and paragraph separators; Cs: lone surrogates (not text at all).
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def plain(value: object, limit: int = MAX_SHOWN) -> str:
    """Return value as one line of printable text, escaping what a terminal would act on."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable():
        return text  # the common case: nothing to escape
    return "".join(_escaped(c) if _unsafe(c) else c for c in text)


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """Return value as printable text to put inside a rich markup string, shown literally."""
    from rich.markup import escape  # rich loads with the view that prints markup, not before

    return escape(plain(value, limit))
