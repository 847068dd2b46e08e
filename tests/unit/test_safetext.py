"""What every view shows of outside text: printable, one line, never markup."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from vox_mqtt.console.safetext import MAX_SHOWN, plain, shown

ATTACKS = [
    "\x1b]0;owned\x07",  # window title
    "\x1b]52;c;cm0gLXJmIH4=\x07",  # OSC 52: write the clipboard
    "\x1b[1A\x1b[2K",  # cursor up, erase line
    "\x9b31m",  # C1 CSI
    "\u202eevil",  # right-to-left override
    "a\u2028b",  # line separator
    "zero\u200bwidth",
    "bell\x07 del\x7f nul\x00",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_plain_escapes_what_a_terminal_would_act_on(text: str) -> None:
    out = plain(text)
    assert out.isprintable()
    assert "\x1b" not in out
    assert "\x9b" not in out


def test_plain_names_the_escaped_characters() -> None:
    assert plain("a\x1b[2Kb") == "a\\x1b[2Kb"
    assert plain("x\ny\tz") == "x\\ny\\tz"
    assert plain("\u202e") == "\\u202e"
    assert plain("\ud800") == "\\ud800"


def test_plain_keeps_ordinary_text_as_it_is() -> None:
    for text in ("analyze", "é ✓ 日本 — ok", "[bold]", "100% done", ""):
        assert plain(text) == text


def test_plain_bounds_the_length() -> None:
    assert plain("x" * (MAX_SHOWN + 50)) == "x" * MAX_SHOWN + "…"
    assert plain("abcdef", 3) == "abc…"
    assert plain(42) == "42"


@pytest.mark.parametrize(
    "text", ["[/]", "[bold red]x", "[/bold]", "ends with \\", "\\[/]", "[link=http://x]y[/link]"]
)
def test_shown_is_printed_literally_inside_markup(text: str) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None, emoji=False)
    console.print(f"[red]{shown(text)}[/] tail")  # no MarkupError
    assert buffer.getvalue() == f"{text} tail\n"


@pytest.mark.parametrize("text", ATTACKS)
def test_shown_prints_no_escape_byte(text: str) -> None:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(f"[bold]{shown(text)}[/]")
    assert "\x1b" not in buffer.getvalue()
    assert "\x9b" not in buffer.getvalue()
