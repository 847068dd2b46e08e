"""Tampering with a real ledger file: what the database refuses, verify finds, the master sees."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from vox_mqtt.cli import main
from vox_mqtt.ledger._schema import _COLUMNS, _TRIGGER_SQL, GENESIS_HASH, _chain_hash
from vox_mqtt.ledger.witness import HeadWitness, check_against_witness
from vox_mqtt.memory import VOXAgentMemory

CHILD, MASTER = uuid4(), uuid4()
ROW = ", ".join(_COLUMNS)


@dataclass
class Pair:
    """A child's ledger and its master's, which witnessed the child's heads as they went by."""

    child: Path
    master: Path


async def witnessed_pair(tmp_path: Path, *, rows: int = 12, final: bool = True) -> Pair:
    """Write `rows` rows to the child; the master witnesses its head every 4 rows and at stop."""
    pair = Pair(tmp_path / "child.db", tmp_path / "master.db")
    async with VOXAgentMemory(pair.child) as child, VOXAgentMemory(pair.master) as master:
        witness = HeadWitness(master)
        for n in range(1, rows + 1):
            await child.record("message", "received", MASTER, CHILD, {"n": n})
            if n % 4 == 0:
                await witness.saw(CHILD, await child.head())
        await witness.saw(CHILD, await child.head(), final=final)
    return pair


def unlocked(path: Path, work: Callable[[sqlite3.Connection], None]) -> None:
    """Do what a forger with write access does: drop every trigger, work, put them back exactly."""
    with sqlite3.connect(path) as db:
        for name in _TRIGGER_SQL:
            db.execute(f"DROP TRIGGER {name}")
        work(db)
        for sql in _TRIGGER_SQL.values():
            db.execute(sql)


def rechain(db: sqlite3.Connection, start: int = 1) -> None:
    """Recompute every hash from row `start` on, from the documented recipe."""
    rows = db.execute(f"SELECT {ROW} FROM logs WHERE id >= ? ORDER BY id", (start,)).fetchall()
    prev = db.execute("SELECT hash FROM logs WHERE id = ?", (start - 1,)).fetchone()
    prev_hash = GENESIS_HASH if prev is None else prev[0]
    for content in rows:
        digest = _chain_hash(prev_hash, content)
        db.execute(
            "UPDATE logs SET prev_hash = ?, hash = ? WHERE id = ?", (prev_hash, digest, content[0])
        )
        prev_hash = digest


async def reports(pair: Pair) -> tuple[bool, str | None]:
    """Return (own chain verifies, what the comparison with the master's ledger says)."""
    async with (
        VOXAgentMemory(pair.child, read_only=True) as child,
        VOXAgentMemory(pair.master, read_only=True) as master,
    ):
        own = await child.verify()
        seen = await check_against_witness(child, master)
    assert seen.agent == CHILD
    return own.ok, seen.problem


# --- refused by the database ------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        # The one that got through before: REPLACE deletes without firing DELETE triggers.
        f"INSERT OR REPLACE INTO logs ({ROW}, prev_hash, hash)"
        f" SELECT {ROW.replace('action', chr(39) + 'forged' + chr(39))}, prev_hash, hash"
        " FROM logs WHERE id = 3",
        f"REPLACE INTO logs ({ROW}, prev_hash, hash) SELECT {ROW}, prev_hash, hash FROM logs"
        " WHERE id = 12",
        "INSERT OR REPLACE INTO ledger_meta (key, value) VALUES ('schema', '1')",
        # Appending is only at the head, chained to it.
        f"INSERT INTO logs ({ROW}, prev_hash, hash) SELECT 14, {ROW[4:]}, hash, hash"
        " FROM logs WHERE id = 12",
        f"INSERT INTO logs ({ROW}, prev_hash, hash) SELECT 13, {ROW[4:]}, prev_hash, hash"
        " FROM logs WHERE id = 12",
    ],
)
async def test_replace_and_out_of_place_inserts_are_refused(tmp_path: Path, sql: str) -> None:
    pair = await witnessed_pair(tmp_path)
    with (
        sqlite3.connect(pair.child) as db,
        pytest.raises(sqlite3.IntegrityError, match="append-only"),
    ):
        db.execute(sql)
    assert await reports(pair) == (True, None)


async def test_a_no_op_trigger_under_the_expected_name_fails_verify(tmp_path: Path) -> None:
    pair = await witnessed_pair(tmp_path)
    with sqlite3.connect(pair.child) as db:
        db.execute("DROP TRIGGER logs_no_update")
        db.execute("CREATE TRIGGER logs_no_update BEFORE UPDATE ON logs BEGIN SELECT 1; END")
    async with VOXAgentMemory(pair.child, read_only=True) as child:
        report = await child.verify()
    assert not report.ok
    assert report.problem == "append-only triggers were changed: logs_no_update"
    # Opening it to write does not quietly put the real one back.
    async with VOXAgentMemory(pair.child) as child:
        assert (await child.verify()).problem == report.problem


async def test_an_older_ledger_gets_the_insert_triggers_once(tmp_path: Path) -> None:
    pair = await witnessed_pair(tmp_path)
    with sqlite3.connect(pair.child) as db:
        db.execute("DROP TRIGGER logs_append_at_head")
        db.execute("DROP TRIGGER meta_no_replace")
        db.execute("DROP TRIGGER meta_no_delete")
        db.execute("DELETE FROM ledger_meta WHERE key = 'triggers'")
        db.execute(_TRIGGER_SQL["meta_no_delete"])
    async with VOXAgentMemory(pair.child) as child:
        assert (await child.verify()).ok
    assert await reports(pair) == (True, None)


# --- a chain that verifies on its own, caught by the master's record ---------------------------


def replace_newest(db: sqlite3.Connection) -> None:
    db.execute("UPDATE logs SET action = 'forged' WHERE id = 12")
    rechain(db, 12)


def full_rechain_after_edit(db: sqlite3.Connection) -> None:
    db.execute("UPDATE logs SET details = '{\"n\":99}' WHERE id = 2")
    rechain(db)


def truncate(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM logs WHERE id > 9")


def delete_and_renumber(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM logs WHERE id = 6")
    db.execute("UPDATE logs SET id = id - 1 WHERE id > 6")
    rechain(db, 6)


def append_forged(db: sqlite3.Connection) -> None:
    head_id, head_hash = db.execute("SELECT id, hash FROM logs ORDER BY id DESC").fetchone()
    content = (head_id + 1, "2026-01-01T00:00:00+00:00", "message", "received")
    content += (str(MASTER), str(CHILD), str(uuid4()), "command_request", None, None)
    content += (None, None, '{"command":"pay"}')
    db.execute(
        f"INSERT INTO logs ({ROW}, prev_hash, hash) VALUES ({', '.join('?' * 15)})",
        (*content, head_hash, _chain_hash(head_hash, content)),
    )


def replace_via_replace(db: sqlite3.Connection) -> None:
    db.execute(
        f"INSERT OR REPLACE INTO logs ({ROW}, prev_hash, hash) SELECT"
        f" {ROW.replace('action', chr(39) + 'forged' + chr(39))}, prev_hash, hash"
        " FROM logs WHERE id = 7"
    )
    rechain(db, 7)


@pytest.mark.parametrize(
    ("forgery", "problem"),
    [
        (replace_newest, "row 12 is not the row its master saw: rewritten since row 12"),
        (full_rechain_after_edit, "row 4 is not the row its master saw: rewritten since row 4"),
        (truncate, "it ends at row 9: rows were removed since row 12"),
        (delete_and_renumber, "row 8 is not the row its master saw: rewritten since row 8"),
        (append_forged, "rows 13-13 follow the head it reported when it stopped (row 12"),
        (replace_via_replace, "row 8 is not the row its master saw: rewritten since row 8"),
    ],
)
async def test_every_rewrite_the_chain_hides_the_master_catches(
    tmp_path: Path,
    forgery: Callable[[sqlite3.Connection], None],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pair = await witnessed_pair(tmp_path)
    unlocked(pair.child, forgery)
    own_ok, seen = await reports(pair)
    assert own_ok, "the forgery should verify on its own: the point is that it is caught anyway"
    assert seen is not None
    assert problem in seen
    capsys.readouterr()
    assert (
        await asyncio.to_thread(
            main, ["ledger", str(pair.child), "verify", "--witness", str(pair.master)]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "disagrees with its master's" in err
    assert problem in err.replace("\n", " ")


async def test_an_untouched_ledger_agrees_and_its_unwitnessed_tail_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = await witnessed_pair(tmp_path, rows=14, final=False)
    async with VOXAgentMemory(pair.child) as child:
        await child.record("message", "sent", CHILD, MASTER, {})
    capsys.readouterr()
    assert (
        await asyncio.to_thread(
            main, ["ledger", str(pair.child), "verify", "--witness", str(pair.master)]
        )
        == 0
    )
    out = capsys.readouterr().out.replace("\n", " ")
    assert f"holds all 4 heads {pair.master} witnessed of agent {CHILD}" in out
    assert "rows 15-15 came after the newest head its master witnessed (row 14" in out


async def test_a_witness_of_several_children_needs_no_name_unless_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = await witnessed_pair(tmp_path)
    other = uuid4()
    async with VOXAgentMemory(pair.master) as master:
        await HeadWitness(master).saw(other, (3, "ab" * 32))
    async with (
        VOXAgentMemory(pair.child, read_only=True) as child,
        VOXAgentMemory(pair.master, read_only=True) as master,
    ):
        assert (await check_against_witness(child, master)).agent == CHILD
        named = await check_against_witness(child, master, UUID(str(other)))
        assert not named.ok
        assert "row 3 is not the row its master saw" in str(named.problem)
    unlocked(pair.child, full_rechain_after_edit)
    capsys.readouterr()
    assert (
        await asyncio.to_thread(
            main, ["ledger", str(pair.child), "verify", "--witness", str(pair.master)]
        )
        == 2
    )
    assert "name this ledger's with --agent" in capsys.readouterr().err
    args = ["ledger", str(pair.child), "verify", "--witness", str(pair.master), "--agent"]
    assert await asyncio.to_thread(main, [*args, str(CHILD)]) == 1
