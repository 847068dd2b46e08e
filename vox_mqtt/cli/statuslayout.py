"""How `vox status` and `vox watch` fit a terminal: pure layout, no I/O (docs/operations.md).

`vox status` shows every agent at any width: its name, state, age, commands (or their
count) and open incidents always; the other columns join in a fixed order while they fit,
each whole or not at all (a column is never shown blank for want of room); `--wide`
shows them all. `vox watch` fits each tree line to the room left after its guides.
Text in cells is already plain (`safetext.plain`): this module measures and cuts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from rich.cells import cell_len

__all__ = [
    "COLUMNS",
    "ESSENTIAL",
    "GAP",
    "MAX_NOTE",
    "MIN_NAME",
    "MIN_NOTE",
    "Column",
    "StatusLayout",
    "cut",
    "fit_parts",
    "layout_status",
]


@dataclass(frozen=True)
class Column:
    """One column of `vox status`: the key of its cell in a row, and its header."""

    key: str
    header: str
    right: bool = False  # figures are aligned right
    ends: bool = False  # a text cut at its end (a reason), not in its middle (a name)


# Left to right as shown. ESSENTIAL ones are always there; the others join in OPTIONAL's
# order while the line still fits.
COLUMNS: Final = (
    Column("name", "name"),
    Column("state", "state"),
    Column("code", "code"),
    Column("age", "age"),
    Column("incidents", "incidents", right=True),
    Column("in_flight", "in flight"),
    Column("epoch", "epoch", right=True),
    Column("rate", "msg/s", right=True),
    Column("errors", "errors", right=True),
    Column("p50", "p50 cmd", right=True),
    Column("cpu", "cpu%", right=True),
    Column("rss", "rss", right=True),
    Column("host_cpu", "host cpu%", right=True),
    Column("host_mem", "host mem%", right=True),
    Column("disk", "disk%", right=True),
    Column("id", "id"),
    Column("commands", "commands"),
    Column("note", "note", ends=True),
)
ESSENTIAL: Final = frozenset({"name", "state", "age", "incidents", "commands"})
OPTIONAL: Final = (
    "code",
    "in_flight",
    "note",
    "epoch",
    "rate",
    "errors",
    "p50",
    "cpu",
    "rss",
    "host_cpu",
    "host_mem",
    "disk",
    "id",
)
GAP: Final = 2  # spaces between columns
MIN_NAME: Final = 12  # a name is cut (in its middle) to no fewer cells than this
# The last column, a refused status's reason, is at most MAX_NOTE cells wide, or the room
# left in its turn if that is less (at least MIN_NOTE), its text cut at the end.
NOTE: Final = "note"
MAX_NOTE: Final = 60
MIN_NOTE: Final = 16
_BY_KEY: Final = {column.key: column for column in COLUMNS}


def cut(text: str, room: int) -> str:
    """Return text within `room` terminal cells, cut in its middle with "…" when longer.

    The middle, not the end: names in one fleet often share a prefix and differ at the end
    (`specialist_a`, `specialist_b`), and both ends stay readable.
    """
    if cell_len(text) <= room:
        return text
    if room <= 1:
        return "…"[:room]
    head_room = room // 2
    tail_room = room - 1 - head_room
    head, tail = "", ""
    for char in text:
        if cell_len(head + char) > head_room:
            break
        head += char
    for char in reversed(text):
        if cell_len(char + tail) > tail_room:
            break
        tail = char + tail
    return head + "…" + tail


def _cut_end(text: str, room: int) -> str:
    """Return text within `room` cells, cut at its end with "…" when longer."""
    if cell_len(text) <= room:
        return text
    kept = ""
    for char in text:
        if cell_len(kept + char) > room - 1:
            break
        kept += char
    return kept + "…"


def _count(commands: str) -> str:
    listed = [c for c in commands.split(", ") if c and c != "-"]
    return "-" if not listed else f"{len(listed)} command" + ("s" if len(listed) > 1 else "")


@dataclass(frozen=True)
class StatusLayout:
    """The columns chosen, their widths, and the rows' cells as they are shown."""

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    rows: tuple[tuple[str, ...], ...]

    def padded(self, cells: Sequence[str]) -> list[str]:
        """Return each cell padded to its column's width (figures to the right)."""
        parts = []
        for column, width, cell in zip(self.columns, self.widths, cells, strict=True):
            pad = " " * max(0, width - cell_len(cell))
            parts.append(pad + cell if column.right else cell + pad)
        return parts

    def line(self, cells: Sequence[str]) -> str:
        """Return one line: each cell padded to its column's width, GAP spaces between."""
        return (" " * GAP).join(self.padded(cells)).rstrip()

    def lines(self) -> list[str]:
        """Return the header line, then one line per row."""
        return [self.line([c.header for c in self.columns]), *map(self.line, self.rows)]


def layout_status(rows: Sequence[Mapping[str, str]], width: int | None) -> StatusLayout:
    """Choose the columns and widths of `vox status` for a terminal `width` cells wide.

    None: `--wide`, every column at its full width. Otherwise the essential columns
    always (a name is cut in its middle, down to MIN_NAME cells, before anything essential
    is dropped; a command list that does not fit becomes its count), then each optional
    column in OPTIONAL's order that still fits, whole. A column no row has a value for
    ("-" everywhere, e.g. `code` in a healthy fleet) is left out at every width but --wide.
    """

    def natural(key: str) -> int:
        header = cell_len(_BY_KEY[key].header)
        wanted = max([header, *(cell_len(row.get(key, "-")) for row in rows)])
        return min(wanted, MAX_NOTE) if key == NOTE and width is not None else wanted

    if width is None:
        chosen = [c.key for c in COLUMNS]
        return _laid(rows, chosen, {key: natural(key) for key in chosen}, counted=False)

    def used(keys: Sequence[str], widths: Mapping[str, int]) -> int:
        return sum(widths[k] for k in keys) + GAP * (len(keys) - 1)

    def known(key: str) -> bool:
        return any(row.get(key, "-") not in ("-", "") for row in rows)

    chosen = [c.key for c in COLUMNS if c.key in ESSENTIAL]
    widths = {key: natural(key) for key in chosen}
    counted = False
    if used(chosen, widths) > width:
        # The list of commands first becomes its count; then the name gives way.
        counted = True
        widths["commands"] = max(
            [cell_len("commands"), *(cell_len(_count(r.get("commands", "-"))) for r in rows)]
        )
    over = used(chosen, widths) - width
    if over > 0:
        widths["name"] = max(MIN_NAME, widths["name"] - over)
    for key in OPTIONAL:
        if not known(key):
            continue
        trial = [c.key for c in COLUMNS if c.key in widths or c.key == key]
        wants = natural(key)
        if key == NOTE:
            # A refused status's reason before the figures: cut to the room left, if any.
            wants = min(wants, width - used(chosen, widths) - GAP)
            if wants < MIN_NOTE:
                continue
        trial_widths = {**widths, key: wants}
        if used(trial, trial_widths) <= width:
            chosen, widths = trial, trial_widths
    return _laid(rows, chosen, widths, counted=counted)


def _laid(
    rows: Sequence[Mapping[str, str]],
    chosen: Sequence[str],
    widths: Mapping[str, int],
    *,
    counted: bool,
) -> StatusLayout:
    columns = tuple(_BY_KEY[key] for key in chosen)
    laid_rows = []
    for row in rows:
        cells = []
        for key in chosen:
            cell = row.get(key, "-") or "-"
            if key == "commands" and counted:
                cell = _count(cell)
            room = widths[key]
            if _BY_KEY[key].ends and cell_len(cell) > room:
                cell = _cut_end(cell, room)
            cells.append(cut(cell, room))
        laid_rows.append(tuple(cells))
    return StatusLayout(columns, tuple(widths[k] for k in chosen), tuple(laid_rows))


def fit_parts(essential: str, optional: Sequence[str], room: int | None) -> tuple[str, str]:
    """Return a `vox watch` line within `room` cells as (essential, " (optional, ...)").

    The essential part is cut in its middle if it must be; each optional part joins, in
    its order, when it still fits whole, so nothing is ever cut at the terminal's edge.
    None: no limit (a pipe), everything.
    """
    if room is None:
        return essential, f" ({', '.join(optional)})" if optional else ""
    head = cut(essential, max(room, 1))
    chosen: list[str] = []
    for part in optional:
        trial = [*chosen, part]
        if cell_len(head) + 3 + cell_len(", ".join(trial)) <= room:
            chosen = trial
    return head, f" ({', '.join(chosen)})" if chosen else ""
