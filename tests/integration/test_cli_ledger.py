"""`vox ledger DB tail|trace|verify` on real ledger files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import pytest

from tests.kits.ledgerkit import build_ledger
from vox_mqtt.cli import main
from vox_mqtt.protocol.messages import VOXMessage


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Path, dict[str, VOXMessage]]:
    path = tmp_path / "logs.db"
    return path, build_ledger(path)


def test_tail_prints_the_newest_rows_oldest_first(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, flow = ledger
    assert main(["ledger", str(path), "tail", "-n", "3"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("│")]
    assert len(lines) == 3
    assert str(flow["i9"].message_id) in lines[0]
    assert str(flow["m3"].message_id) in lines[1]
    assert "rejected" in lines[2]
    assert "not valid JSON [line 1]" in lines[2]
    assert str(flow["a1"].message_id) not in out


def test_tail_json_is_machine_readable(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, flow = ledger
    assert main(["ledger", str(path), "tail", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["id"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["message_id"] == str(flow["a1"].message_id)
    assert rows[0]["details"]["command"] == "analyze"


def test_trace_draws_the_chain_by_reply_to(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, flow = ledger
    assert main(["ledger", str(path), "trace", str(flow["i9"].message_id)]) == 0
    out = capsys.readouterr().out
    for name in ("a1", "e5", "i9", "m3"):
        assert str(flow[name].message_id) in out
    assert str(flow["other"].message_id) not in out
    lines = out.splitlines()
    # The tree nests the specialist's answer under the request it answers.
    depth = {
        name: next(
            len(line) - len(line.lstrip("│├└─ "))
            for line in lines
            if str(flow[name].message_id) in line
        )
        for name in ("a1", "e5", "i9", "m3")
    }
    assert depth["a1"] < depth["e5"] == depth["m3"] < depth["i9"]


def test_trace_json_lists_one_row_per_message(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, flow = ledger
    assert main(["ledger", str(path), "trace", str(flow["a1"].message_id), "--json"]) == 0
    chain = json.loads(capsys.readouterr().out)
    assert [row["message_id"] for row in chain] == [
        str(flow[name].message_id) for name in ("a1", "e5", "i9", "m3")
    ]


def test_trace_of_an_unknown_message_fails_clearly(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = ledger
    missing = uuid4()
    assert main(["ledger", str(path), "trace", str(missing)]) == 1
    assert f"message {missing} is not in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["ledger", str(path), "trace", "not-a-uuid"])
    assert exited.value.code == 2
    assert "not a message id" in capsys.readouterr().err


def test_verify_passes_then_names_the_tampered_row(
    ledger: tuple[Path, dict[str, VOXMessage]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = ledger
    assert main(["ledger", str(path), "verify"]) == 0
    assert "ok" in capsys.readouterr().out
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER logs_no_update")
        db.execute("UPDATE logs SET action = 'forged' WHERE id = 3")
    assert main(["ledger", str(path), "verify"]) == 1
    err = capsys.readouterr().err
    assert "first bad row: 3" in err
    assert "does not match its hash" in err


@pytest.mark.parametrize("verb", [["tail"], ["verify"], ["trace", str(uuid4())]])
def test_a_missing_ledger_is_a_usage_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    path = tmp_path / "nope.db"
    assert main(["ledger", str(path), *verb]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_ledger_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("shopping list\n" * 20)
    assert main(["ledger", str(path), "tail"]) == 2
    assert "not a vox ledger" in capsys.readouterr().err
    assert main(["ledger", str(tmp_path), "verify"]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_the_installed_command_reports_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", "ledger", str(tmp_path / "x.db"), "verify"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "x.db does not exist" in done.stderr
    assert not (tmp_path / "x.db").exists()
