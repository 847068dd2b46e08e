"""A broken daemon config: a clear message per problem, exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.daemonkit import render

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_daemon", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        check=False,
    )


def _edit(old: str, new: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))

    return edit


def _remove_credentials(path: Path) -> None:
    (path.parent / "root.credentials.toml").unlink()


def _state_dir_is_a_file(path: Path) -> None:
    state = path.parent.parent / "state"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("not a folder")


BREAKAGES = [
    ("not valid TOML", lambda p: p.write_text("kind = 'agent'\n[agent\n")),
    ("agent.id: Input should be a valid UUID", _edit('id = "', 'id = "not-a-uuid-')),
    ("broker.port: Input should be less than or equal to 65535", _edit("port = 1", "port = 70000")),
    ("agent.colour: unknown key", _edit("[agent]\n", '[agent]\ncolour = "red"\n')),
    (
        "cannot import 'no_such_module'",
        _edit("tests.kits.roles_for_tests:Sleeper", "no_such_module:X"),
    ),
    (
        "tests.kits.roles_for_tests.Nope is not a vox_mqtt Role",
        _edit("tests.kits.roles_for_tests:Sleeper", "tests.kits.roles_for_tests:Nope"),
    ),
    (
        "invalid settings: setting 'required' is missing",
        _edit("tests.kits.roles_for_tests:Sleeper", "tests.kits.roles_for_tests:Broken"),
    ),
    ("cannot read the broker credentials", _remove_credentials),
    ("state dir", _state_dir_is_a_file),
    ("this is a 'operator' config, not an agent's", _edit('kind = "agent"', 'kind = "operator"')),
    (
        "agent.ledger_sync: Input should be 'full' or 'normal'",
        _edit("[agent]\n", '[agent]\nledger_sync = "off"\n'),
    ),
]


@pytest.mark.parametrize(("expected", "breakage"), BREAKAGES, ids=[b[0][:30] for b in BREAKAGES])
def test_a_broken_config_exits_2_with_a_readable_reason(
    tmp_path: Path, expected: str, breakage: Callable[[Path], None]
) -> None:
    config = render(tmp_path)
    breakage(config)
    result = _run("--config", str(config))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "not starting: fix" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    result = _run("--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: no such config file" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_validates_without_connecting(tmp_path: Path) -> None:
    config = render(tmp_path)
    result = _run("--config", str(config), "--check")
    assert result.returncode == 0, result.stderr
    assert "OK (root, 1 role(s))" in result.stdout


def test_usage_errors_are_argparse_errors() -> None:
    result = _run()
    assert result.returncode == 2
    assert "--config" in result.stderr
    assert "Traceback" not in result.stderr
