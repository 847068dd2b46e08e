"""The `vox` verb table: what `vox --help` lists without importing a verb's module.

vox_mqtt/cli/__init__.py builds its parser from VERBS (name, module, help) and imports only
the chosen verb's module. These tests hold the table to what the modules register, the
lazy parser's help and errors to the whole one's (docs/architecture.md, "The command
line"); tests/integration/test_cli_imports.py checks what each verb imports.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from vox_mqtt.cli import VERBS, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(found) == 1
    return found[0]


def _listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    return [(a.dest, a.help) for a in _subparsers(parser)._choices_actions]


def test_the_table_is_what_the_modules_register_in_order() -> None:
    whole = build_parser([], every=True)
    assert _listed(whole) == [(verb, help) for verb, _, help in VERBS]
    owners = {verb: module for verb, module, _ in VERBS}
    for verb, sub in _subparsers(whole).choices.items():
        func = sub.get_default("func")
        if func is None:  # a group (`vox broker ...`): its verbs' func is one level down
            func = next(
                (
                    p.get_default("func")
                    for a in sub._actions
                    if isinstance(a, argparse._SubParsersAction)
                    for p in a.choices.values()
                ),
                None,
            )
        assert func is not None, verb
        assert func.__module__.rsplit(".", 1)[-1] in (owners[verb], "warroom"), verb


def _outcome(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
            code: object = None
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        [],
        ["nosuchverb"],
        ["-x"],
        ["status", "--help"],
        ["status", "--wait", "soon"],
        ["request", "--help"],
        ["request", "show", "--help"],
        ["request"],
        ["inbox", "--nosuch"],
        ["warroom", "-h"],
        ["pki", "--help"],
    ],
)
def test_the_lazy_parser_says_what_the_whole_one_says(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    lazy = _outcome(build_parser(argv), argv)
    whole = _outcome(build_parser(argv, every=True), argv)
    assert lazy == whole
    assert lazy[0] == (0 if "--help" in argv or "-h" in argv else 2)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"COLUMNS": "123"},
        {"COLUMNS": "wide"},
        {"FORCE_COLOR": "1"},
        {"FORCE_COLOR": "1", "TERM": "dumb", "COLUMNS": "150"},
        {"TTY_COMPATIBLE": "1", "COLUMNS": "90"},
        {"TTY_COMPATIBLE": "0", "COLUMNS": "90"},
        {"FORCE_COLOR": ""},
        {"FORCE_COLOR": "1", "TERM": "dumb", "COLUMNS": "150", "LINES": "40"},
        {"TERM": "dumb", "COLUMNS": "150"},
    ],
)
def test_the_width_a_verb_reckons_is_rich_s(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from vox_mqtt.cli._common import out_console, status_width, stdout_is_terminal, terminal_width

    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TERM", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rich: Console = out_console()
    assert stdout_is_terminal() == rich.is_terminal
    assert terminal_width() == rich.width
    wanted = rich.width if rich.is_terminal or env.get("COLUMNS") else 200
    assert status_width(False) == wanted
    assert status_width(True) is None


def test_the_inbox_drops_the_key_the_decisions_name() -> None:
    from vox_mqtt.cli.session import _OVERLAPS
    from vox_mqtt.console.decisions import OVERLAPS

    assert _OVERLAPS == OVERLAPS
