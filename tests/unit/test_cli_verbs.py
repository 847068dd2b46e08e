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
