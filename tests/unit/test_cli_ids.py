"""Ids a view prints are accepted back: prefixes, ambiguity, and names next to ids."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from tests.kits.ledgerkit import COORD, ROOT, SPEC, build_ledger
from vox_mqtt.cli import main
from vox_mqtt.cli._ids import normalize_prefix
from vox_mqtt.memory import VOXAgentMemory
from vox_mqtt.protocol.messages import new_message


def fleet_file(path: Path) -> Path:
    path.write_text(
        f'[operator]\nname = "ops"\nid = "{uuid4()}"\n\n'
        f'[[agents]]\nname = "root"\nid = "{ROOT}"\n\n'
        f'[[agents]]\nname = "coordinator"\nid = "{COORD}"\nmaster_id = "{ROOT}"\n\n'
        f'[[agents]]\nname = "spec_a"\nid = "{SPEC}"\nmaster_id = "{COORD}"\n'
    )
    return path


def test_every_id_tail_prints_is_accepted_by_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "logs.db"
    flow = build_ledger(db)
    assert main(["ledger", str(db), "tail"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    printed = set()
    for row in rows:
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        printed.update(c for c in (cells[4], cells[7]) if c)  # message_id, reply_to
        printed.update(re.findall(r"in_response_to=([0-9a-f]+)", cells[8]))
    assert any(len(p) == 8 for p in printed)
    assert any(len(p) == 36 for p in printed)
    for shown in printed:
        assert main(["ledger", str(db), "trace", shown, "--json"]) == 0, shown
        out = capsys.readouterr().out
        assert shown in out
    # Upper case and without hyphens, as people paste them, too.
    whole = str(flow["e5"].message_id)
    assert main(["ledger", str(db), "trace", whole.replace("-", "")[:12].upper()]) == 0
    assert whole in capsys.readouterr().out


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "logs.db"
    twins = [UUID(f"2e2584a2-0000-4000-8000-{n:012x}") for n in (0x100, 0x200)]

    async def write() -> None:
        async with VOXAgentMemory(db) as ledger:
            for twin in twins:
                message = new_message(
                    "command_request",
                    source=ROOT,
                    target=COORD,
                    details={"command": "ping", "params": {}},
                )
                await ledger.record_message(message.model_copy(update={"message_id": twin}), "x")

    asyncio.run(write())
    assert main(["ledger", str(db), "trace", "2e2584a2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'2e2584a2' is ambiguous" in err
    assert str(twins[0]) in err
    assert str(twins[1]) in err
    assert main(["ledger", str(db), "trace", str(twins[1])[:-1]]) == 0
    assert main(["ledger", str(db), "trace", "dead"]) == 1
    assert "no message id starting with 'dead'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["ledger", str(db), "trace", "2e2"])
    assert exited.value.code == 2
    assert "too short" in capsys.readouterr().err


def test_normalize_prefix_puts_hyphens_where_uuids_have_them() -> None:
    assert normalize_prefix("2E2584A2", "id") == "2e2584a2"
    assert normalize_prefix("2e2584a21234", "id") == "2e2584a2-1234"
    assert normalize_prefix("2e2584a2-12345", "id") == "2e2584a2-1234-5"
    with pytest.raises(ValueError, match="not a id"):
        normalize_prefix("zz", "id")


def test_tail_and_trace_show_names_from_a_fleet_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "logs.db"
    flow = build_ledger(db)
    fleet = fleet_file(tmp_path / "fleet.toml")
    assert main(["ledger", str(db), "tail", "--config", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert f"root {str(ROOT)[:8]}" in out
    assert f"coordinator {str(COORD)[:8]}" in out
    assert f"handled_by=coordinator:{str(COORD)[:8]}" in out
    assert (
        main(["ledger", str(db), "trace", str(flow["i9"].message_id)[:8], "--config", str(fleet)])
        == 0
    )
    out = capsys.readouterr().out
    assert f"coordinator {str(COORD)[:8]} → spec_a {str(SPEC)[:8]}" in out
    assert main(["ledger", str(db), "tail", "--json", "--config", str(fleet)]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert (rows[0]["source_name"], rows[0]["target_name"]) == ("root", "coordinator")


def test_names_come_from_the_console_config_next_to_its_state_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The layout `vox agent render FLEET operator` writes: operator.toml, operator-state/.
    state = tmp_path / "operator-state"
    state.mkdir()
    db = state / "logs.db"
    build_ledger(db)
    (tmp_path / "operator.toml").write_text(
        f'kind = "operator"\n[operator]\nname = "operator"\nid = "{uuid4()}"\n'
        f'root_id = "{COORD}"\nroot_name = "coordinator"\nstate_dir = "operator-state"\n'
        '[broker]\nusername = "x"\n'
    )
    assert main(["ledger", str(db), "tail"]) == 0
    assert f"coordinator {str(COORD)[:8]}" in capsys.readouterr().out
    # A --config that cannot be read is one line and exit 2.
    assert main(["ledger", str(db), "tail", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nope.toml" in err


def test_a_forged_names_file_beside_a_copied_ledger_is_named_and_never_printed_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    db = tmp_path / "copied" / "logs.db"
    db.parent.mkdir()
    build_ledger(db)
    forged = {str(ROOT): "coordinator", str(COORD): "\x1b]0;pwned\x07evil", str(SPEC): "[/]"}
    (db.parent / "names.json").write_text(json.dumps(forged))
    assert main(["ledger", str(db), "tail"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "pwned" not in out
    assert "[/]" not in out
    # The one plain name it holds is shown, and the view says where it came from.
    assert f"coordinator {str(ROOT)[:8]}" in out
    assert "names from" in out
    assert "names.json" in out
    # With the fleet file, names come from it alone.
    fleet = fleet_file(tmp_path / "fleet.toml")
    assert main(["ledger", str(db), "tail", "--config", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert f"root {str(ROOT)[:8]}" in out
    assert f"coordinator {str(ROOT)[:8]}" not in out
    assert "names.json" not in out
    assert "the fleet file" in out
