"""The ledger on real SQLite files: durable, append-only, tamper-evident, batched."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kits.ledgerkit import acknowledged_before_sigkill, assert_each_kept
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import VOXMessage, new_message

ROOT, COORD, SPEC_A, OPERATOR = uuid4(), uuid4(), uuid4(), uuid4()


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[VOXAgentMemory]:
    async with VOXAgentMemory(tmp_path / "logs.db") as ledger:
        yield ledger


def raw_bytes(path: Path) -> bytes:
    """Everything SQLite keeps on disk for the ledger: the file, its WAL and shm."""
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def command(source: UUID, target: UUID, name: str = "analyze", /, **params: Any) -> VOXMessage:
    return new_message(
        "command_request", source=source, target=target, details={"command": name, "params": params}
    )


# --- lifecycle ---------------------------------------------------------------------------------


async def test_schema_is_created_lazily_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    ledger = VOXAgentMemory(path)
    assert not path.exists()  # the constructor does no I/O
    await ledger.init_db()
    await ledger.init_db()  # idempotent
    first = await ledger.record("message", "received", ROOT, COORD, {"n": 1})
    await ledger.close()
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"logs", "ledger_meta"} <= tables
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    async with VOXAgentMemory(path) as again:
        second = await again.record("message", "received", ROOT, COORD, {"n": 2})
        assert (first, second) == (1, 2)
        assert (await again.verify()).ok


async def test_the_seed_003_call_works_verbatim(tmp_path: Path) -> None:
    class Agent:
        memory = VOXAgentMemory(tmp_path / "logs.db")

    agent = Agent()
    msg = {
        "message_id": "fa703dc8-0003-46f0-b4be-8dd0a5f398ac",
        "emitted_at": "2026-01-11T08:00:00-03:00",
        "source": str(SPEC_A),
        "target": str(COORD),
    }
    await agent.memory.init_db()
    await agent.memory.record(
        event_type="message",
        action="received",
        source=msg["source"],
        target=msg["target"],
        details={"message_id": msg["message_id"], "emitted_at": msg["emitted_at"]},
    )
    rows = await agent.memory.get_recent(limit=10)
    await agent.memory.close()
    assert len(rows) == 1
    row = rows[0]
    assert (row["event_type"], row["action"]) == ("message", "received")
    assert (row["source"], row["target"]) == (str(SPEC_A), str(COORD))
    assert row["details"] == {"message_id": msg["message_id"], "emitted_at": msg["emitted_at"]}
    # The well-known keys also land in indexed columns, so dedupe finds the seed call.
    assert row["message_id"] == msg["message_id"]
    assert row["emitted_at"] == msg["emitted_at"]


async def test_get_recent_is_newest_first_and_limited(memory: VOXAgentMemory) -> None:
    for n in range(5):
        await memory.record("message", "sent", COORD, ROOT, {"n": n})
    rows = await memory.get_recent(3)
    assert [r["details"]["n"] for r in rows] == [4, 3, 2]
    assert [r["id"] for r in rows] == [5, 4, 3]
    assert await memory.get_recent(0) == []
    with pytest.raises(LedgerError, match="limit"):
        await memory.get_recent(-1)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"this is not sqlite at all, just some bytes " * 3, "not a database"),
        (None, "its tables: t"),
    ],
)
async def test_a_file_that_is_not_a_ledger_is_refused(
    tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "other.db"
    if content is None:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE t (x)")
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=expected) as caught:
        await VOXAgentMemory(path).init_db()
    assert str(path) in str(caught.value)
    assert path.read_bytes() == before


async def test_bad_locations_are_refused_without_creating_anything(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="existing directory"):
        await VOXAgentMemory(tmp_path).init_db()
    with pytest.raises(LedgerError, match="existing directory"):
        await VOXAgentMemory(tmp_path / "missing" / "logs.db").init_db()
    with pytest.raises(LedgerError, match="no ledger"):
        await VOXAgentMemory(tmp_path / "logs.db", read_only=True).init_db()
    assert list(tmp_path.iterdir()) == []


async def test_read_only_reads_but_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path) as ledger:
        await ledger.record("message", "received", ROOT, COORD, {})
    async with VOXAgentMemory(path, read_only=True) as reader:
        assert len(await reader.get_recent()) == 1
        with pytest.raises(LedgerError, match="read-only"):
            await reader.record("message", "received", ROOT, COORD, {})


# --- append-only and the hash chain ---------------------------------------------------------


async def filled(path: Path, rows: int = 5) -> None:
    async with VOXAgentMemory(path) as ledger:
        for n in range(rows):
            await ledger.record("message", "received", ROOT, COORD, {"n": n})


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE logs SET action = 'sent' WHERE id = 2",
        "DELETE FROM logs WHERE id = 2",
        "DELETE FROM logs",
        "UPDATE ledger_meta SET value = '0'",
        "DELETE FROM ledger_meta",
    ],
)
async def test_update_and_delete_are_refused_by_the_database(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "logs.db"
    await filled(path)
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(sql)
    async with VOXAgentMemory(path) as ledger:
        report = await ledger.verify()
    assert (report.ok, report.rows) == (True, 5)


def tamper(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as db:
        for name in ("logs_no_update", "logs_no_delete"):
            db.execute(f"DROP TRIGGER {name}")
        for sql in statements:
            db.execute(sql)


def forged_hash(path: Path, row_id: int) -> str:
    """Recompute a row's hash the way a careful forger would, from the documented recipe."""
    with sqlite3.connect(path) as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(logs)")][:-2]
        row = db.execute(f"SELECT {', '.join(cols)}, prev_hash FROM logs WHERE id = ?", (row_id,))
        *content, prev = row.fetchone()
    canonical = json.dumps(
        dict(zip(cols, content, strict=True)),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256((prev + canonical).encode()).hexdigest()


@pytest.mark.parametrize(
    ("statements", "bad_row", "problem"),
    [
        (["UPDATE logs SET action = 'sent' WHERE id = 3"], 3, "does not match its hash"),
        (["UPDATE logs SET details = '{\"n\":99}' WHERE id = 5"], 5, "does not match its hash"),
        (["DELETE FROM logs WHERE id = 3"], 4, "missing"),
        (["DELETE FROM logs WHERE id = 1"], 2, "missing"),
        (["UPDATE logs SET prev_hash = hash WHERE id = 4"], 4, "does not chain"),
        (
            [
                "INSERT INTO logs SELECT 6, recorded_at, event_type, 'forged', source, target,"
                " message_id, message_type, reply_to, emitted_at, outcome, reason, details,"
                " hash, hash FROM logs WHERE id = 5"
            ],
            6,
            "does not match its hash",
        ),
    ],
)
async def test_verify_finds_the_first_tampered_row(
    tmp_path: Path, statements: list[str], bad_row: int, problem: str
) -> None:
    path = tmp_path / "logs.db"
    await filled(path)
    tamper(path, *statements)
    async with VOXAgentMemory(path) as ledger:
        report = await ledger.verify()
    assert not report.ok
    assert report.first_bad_row == bad_row
    assert problem in (report.problem or "")


async def test_a_rehashed_edit_is_found_at_the_next_row(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    await filled(path)
    tamper(path, "UPDATE logs SET action = 'sent' WHERE id = 3")
    tamper_hash = forged_hash(path, 3)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE logs SET hash = ? WHERE id = 3", (tamper_hash,))
    async with VOXAgentMemory(path) as ledger:
        report = await ledger.verify()
    assert (report.ok, report.first_bad_row) == (False, 4)


async def test_missing_triggers_fail_verification(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    await filled(path)
    tamper(path)
    async with VOXAgentMemory(path) as ledger:
        report = await ledger.verify()
    assert (report.ok, report.rows, report.first_bad_row) == (False, 5, None)
    assert "logs_no_delete" in (report.problem or "")


# --- what is stored ------------------------------------------------------------------------


async def test_note_to_human_and_payload_text_never_reach_the_disk(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    job = new_message(
        "job_detected",
        source=SPEC_A,
        target=COORD,
        details={
            "start_time": "2026-01-11T08:15:00-03:00",
            "end_time": "2026-01-11T16:00:00-03:00",
            "estimated_effort_minutes": 60,
            "price": {"currency": "USD", "value": 30},
            "note_to_human": "Client: Netwire SECRET-ONE",
        },
    )
    request = command(
        ROOT, COORD, note_to_human="SECRET-TWO", nested=[{"note_to_human": "NESTED-SIX"}]
    )
    async with VOXAgentMemory(path) as ledger:
        await ledger.record_message(job, "received")
        await ledger.record_message(request, "received")
        await ledger.record(
            "message",
            "received",
            SPEC_A,
            COORD,
            {"message_id": str(uuid4()), "note_to_human": "SECRET-FOUR", "x": {"note_to_human": 5}},
        )
        await ledger.record_rejected(
            b'{"note_to_human": "SECRET-FIVE"', "not JSON", topic=None, source=None, message_id=None
        )
        rows = await ledger.get_recent()
    data = raw_bytes(path)
    # Markers long enough not to turn up by chance in a page's binary: the two bytes "X3"
    # once did, in a full suite run (a rowid, a length, any two bytes may spell them).
    for secret in (b"SECRET", b"Netwire", b"note_to_human", b"NESTED-SIX"):
        assert secret not in data
    by_type = {r["message_type"]: r["details"] for r in rows}
    assert by_type["job_detected"] == {"message_source": ledger.stored_source("vox-mqtt")}
    assert by_type["command_request"]["params"] == {"nested": [{}]}


async def test_a_command_request_keeps_what_a_restart_needs(memory: VOXAgentMemory) -> None:
    request = command(ROOT, COORD, "analyze", target="db-7", depth=2)
    await memory.record_message(request, "received", topic="vox/c/inbox/r")
    (row,) = await memory.find(request.message_id)
    assert row["message_type"] == "command_request"
    assert (row["source"], row["target"]) == (str(ROOT), str(COORD))
    assert row["emitted_at"] == request.emitted_at
    assert row["details"] == {
        "command": "analyze",
        "params": {"target": "db-7", "depth": 2},
        "message_source": memory.stored_source("vox-mqtt"),
        "topic": "vox/c/inbox/r",
    }
    error = request.reply("command_error", {"code": "NO_ROUTE", "error": "free text here"})
    await memory.record_message(error, "sent", outcome="NO_ROUTE", reason="no child serves it")
    (row,) = await memory.find(error.message_id)
    source = memory.stored_source("vox-mqtt")
    assert row["details"] == {"code": "NO_ROUTE", "message_source": source}
    assert (row["outcome"], row["reason"], row["reply_to"]) == (
        "NO_ROUTE",
        "no child serves it",
        str(request.message_id),
    )


async def test_rejected_input_is_recorded_by_digest(memory: VOXAgentMemory) -> None:
    raw = b"\xff\xfe not utf-8 at all"
    mid = uuid4()
    await memory.record_rejected(
        raw, "x" * 5000, topic="vox/c/inbox/s", source=SPEC_A, message_id=mid
    )
    (row,) = await memory.find(mid)
    assert row["action"] == "rejected"
    assert row["details"] == {
        "size": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "topic": "vox/c/inbox/s",
    }
    assert row["source"] == str(SPEC_A)
    assert len(row["reason"]) == 1000
    assert not await memory.has_message(mid)


async def test_bad_records_fail_alone(memory: VOXAgentMemory) -> None:
    good = asyncio.gather(*(memory.record("message", "ok", None, None, {"n": n}) for n in range(5)))
    with pytest.raises(LedgerError, match="not JSON serializable"):
        await memory.record("message", "received", None, None, {"x": object()})
    with pytest.raises(LedgerError, match="surrogate"):
        await memory.record("message", "received", "\udc80", None, {})
    with pytest.raises(LedgerError, match="action"):
        await memory.record("message", "", None, None, {})
    with pytest.raises(LedgerError, match="must be a dict"):
        await memory.record("message", "received", None, None, ["x"])  # type: ignore[arg-type]
    assert await good == [1, 2, 3, 4, 5]
    assert (await memory.verify()).ok


async def test_a_failed_transaction_leaves_no_trace(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path) as ledger:
        # A real SQLite failure mid-batch, injected through the database itself.
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON logs WHEN NEW.action = 'poison'"
                " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        actions = ["ok", "ok", "poison", "ok"]
        results = await asyncio.gather(
            *(ledger.record("m", action, None, None, {}) for action in actions),
            return_exceptions=True,
        )
        assert all(isinstance(r, LedgerError) and "poisoned" in str(r) for r in results)
        assert await ledger.get_recent() == []
        assert await ledger.record("m", "after", None, None, {}) == 1
        assert (await ledger.verify()).problem == "unexpected triggers on the ledger: poison"
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER poison")
        assert (await ledger.verify()).ok


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "note_to_human"]), inner, max_size=3)
    ),
    max_leaves=10,
)


def without_notes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_notes(v) for k, v in value.items() if k != "note_to_human"}
    if isinstance(value, list):
        return [without_notes(v) for v in value]
    return value


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(details=st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_any_json_details_round_trip_minus_notes(tmp_path: Path, details: dict[str, Any]) -> None:
    async def check() -> None:
        async with VOXAgentMemory(tmp_path / f"{uuid4()}.db") as ledger:
            await ledger.record("message", "received", None, None, details)
            (row,) = await ledger.get_recent()
            assert row["details"] == without_notes(details)
            assert (await ledger.verify()).ok

    asyncio.run(check())


# --- durability and group commit -------------------------------------------------------------

CHILD = """
import asyncio, sys, uuid
from vox_mqtt.ledger import VOXAgentMemory

async def one(ledger):
    mid = str(uuid.uuid4())
    row = await ledger.record("message", "received", None, None, {"message_id": mid})
    # Printed only after the await returned: from here on the row must survive anything.
    print(row, mid, flush=True)

async def main():
    ledger = VOXAgentMemory(sys.argv[1])
    await ledger.init_db()
    while True:
        await asyncio.gather(*(one(ledger) for _ in range(25)))

asyncio.run(main())
"""


async def test_an_acknowledged_record_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    acknowledged = await acknowledged_before_sigkill(CHILD, str(path), count=400)
    async with VOXAgentMemory(path) as ledger:
        await assert_each_kept(ledger, acknowledged)
        report = await ledger.verify()
        assert report.ok, report.problem
        assert report.rows >= len(acknowledged)
        # The reopened chain keeps growing from where the killed process stopped.
        assert await ledger.record("message", "x", None, None, {}) == report.rows + 1


FORGETFUL = """
import asyncio, sys
from vox_mqtt.ledger import VOXAgentMemory

async def main():
    ledger = VOXAgentMemory(sys.argv[1])
    print(await ledger.record("message", "received", None, None, {}), flush=True)
    # No close(): asyncio.run cancels the writer, which must still release sqlite's threads.

asyncio.run(main())
"""


async def test_a_forgotten_close_does_not_hang_the_process(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FORGETFUL, str(path), stdout=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(30):
            out, _ = await child.communicate()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert (child.returncode, out.strip()) == (0, b"1")
    async with VOXAgentMemory(path) as ledger:
        assert (await ledger.verify()).rows == 1


async def test_concurrent_records_share_transactions(tmp_path: Path) -> None:
    async with VOXAgentMemory(tmp_path / "grouped.db") as grouped:
        ids = await asyncio.gather(*(grouped.record("m", "r", None, None, {}) for _ in range(200)))
        assert sorted(ids) == list(range(1, 201))
        assert grouped.commit_count <= 10
        assert (await grouped.verify()).ok
    async with VOXAgentMemory(tmp_path / "single.db", max_batch=1) as single:
        await asyncio.gather(*(single.record("m", "r", None, None, {}) for _ in range(200)))
        assert single.commit_count == 200
    async with VOXAgentMemory(tmp_path / "capped.db", max_batch=16) as capped:
        await asyncio.gather(*(capped.record("m", "r", None, None, {}) for _ in range(200)))
        assert capped.commit_count >= 13
        assert (await capped.verify()).rows == 200


async def test_close_writes_what_is_queued_then_refuses(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    ledger = VOXAgentMemory(path, commit_window=0.05, max_batch=7)
    await ledger.init_db()
    tasks = [asyncio.create_task(ledger.record("m", "r", None, None, {"n": n})) for n in range(50)]
    await asyncio.sleep(0)  # let them all queue
    await ledger.close()
    await ledger.close()  # idempotent
    assert sorted(await asyncio.gather(*tasks)) == list(range(1, 51))
    with pytest.raises(LedgerError, match="closed"):
        await ledger.record("m", "r", None, None, {})
    with pytest.raises(LedgerError, match="closed"):
        await ledger.get_recent()
    async with VOXAgentMemory(path) as again:
        assert (await again.verify()).rows == 50


# --- queries -------------------------------------------------------------------------------


async def test_dedupe_is_by_message_id_and_action(memory: VOXAgentMemory) -> None:
    request = command(ROOT, COORD)
    assert not await memory.has_message(request.message_id)
    await memory.record_message(request, "received")
    assert await memory.has_message(request.message_id)
    assert await memory.has_message(UUID(str(request.message_id).upper()))
    assert not await memory.has_message(request.message_id, "completed")
    assert not await memory.has_message(uuid4())


async def test_pending_and_interrupted_commands_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    names = ("fresh", "running", "done", "failed", "handed", "handed_done", "refused")
    cmd = {name: command(ROOT, COORD, name) for name in names}
    not_a_command = new_message(
        "data_request", source=ROOT, target=COORD, details={"subject": "financial_summary"}
    )
    async with VOXAgentMemory(path) as ledger:
        for request in cmd.values():
            await ledger.record_message(request, "received")
        await ledger.record_message(cmd["running"], "started")
        await ledger.record_message(cmd["done"], "started")
        await ledger.record_message(cmd["done"], "completed", outcome="ok")
        await ledger.record_message(cmd["failed"], "failed", outcome="HANDLER_ERROR")
        await ledger.record_message(cmd["fresh"], "duplicate")
        await ledger.record_message(cmd["handed"], "delegated")
        await ledger.record_message(cmd["handed_done"], "delegated")
        # Answered without a completed row (a delegated result, a NO_ROUTE): over all the same.
        answer = cmd["handed_done"].reply("command_result", {"result": 1, "handled_by": COORD})
        await ledger.record_message(answer, "sent")
        no_route = cmd["refused"].reply("command_error", {"code": "NO_ROUTE", "error": "none"})
        await ledger.record_message(no_route, "sent")
        await ledger.record_message(cmd["fresh"].acknowledgement(), "sent")
        await ledger.record_message(not_a_command, "received")
    async with VOXAgentMemory(path) as ledger:
        pending = await ledger.pending_commands()
        interrupted = await ledger.interrupted_commands()
    assert [r["message_id"] for r in pending] == [str(cmd["fresh"].message_id)]
    assert pending[0]["details"] == {
        "command": "fresh",
        "params": {},
        "message_source": ledger.stored_source("vox-mqtt"),
    }
    assert [(r["message_id"], r["action"]) for r in interrupted] == [
        (str(cmd["running"].message_id), "started"),
        (str(cmd["handed"].message_id), "delegated"),
    ]


async def record_seed_000_flow(ledger: VOXAgentMemory) -> dict[str, VOXMessage]:
    """The coordinator's side of seed 000 steps 2-6, each message with its acknowledgement."""
    a1 = command(ROOT, COORD, target="x")
    e5 = new_message(
        "command_request",
        source=COORD,
        target=SPEC_A,
        details={"command": "analyze", "params": {"target": "x"}},
        reply_to=a1.message_id,
    )
    i9 = e5.reply("command_result", {"result": "..."})
    m3 = a1.reply("command_result", {"command": "analyze", "result": "...", "handled_by": COORD})
    noise = command(ROOT, COORD, "unrelated")
    await ledger.record_message(a1, "received")
    await ledger.record_message(noise, "received")
    await ledger.record_message(a1.acknowledgement(), "sent")
    await ledger.record_message(a1, "started")
    await ledger.record_message(e5, "sent")
    await ledger.record_message(e5.acknowledgement(), "received")
    await ledger.record_message(i9, "received")
    await ledger.record_message(i9.acknowledgement(), "sent")
    await ledger.record_message(m3, "sent")
    await ledger.record_message(m3.acknowledgement(), "received")
    await ledger.record_message(a1, "completed")
    await ledger.record_message(noise.acknowledgement(), "sent")
    return {"a1": a1, "e5": e5, "i9": i9, "m3": m3, "noise": noise}


async def test_trace_rebuilds_the_seed_000_chain(memory: VOXAgentMemory) -> None:
    flow = await record_seed_000_flow(memory)
    chains = [await memory.trace(flow[name].message_id) for name in ("a1", "e5", "i9", "m3")]
    assert all(chain == chains[0] for chain in chains)
    chain = chains[0]
    assert len(chain) == 8  # four messages and their four acknowledgements
    assert len({row["message_id"] for row in chain}) == 8
    assert [row["id"] for row in chain] == sorted(row["id"] for row in chain)
    top = chain[0]
    assert top["message_id"] == str(flow["a1"].message_id)
    assert (top["action"], top["actions"]) == ("received", ["received", "started", "completed"])
    assert str(flow["noise"].message_id) not in {row["message_id"] for row in chain}
    by_id = {row["message_id"]: row for row in chain}
    assert by_id[str(flow["m3"].message_id)]["details"]["handled_by"] == str(COORD)
    assert by_id[str(flow["i9"].message_id)]["reply_to"] == str(flow["e5"].message_id)
    assert len(await memory.trace(flow["noise"].message_id)) == 2
    assert await memory.trace(uuid4()) == []


async def test_trace_stops_at_the_first_ancestor_this_ledger_holds(memory: VOXAgentMemory) -> None:
    # The root's ledger: the operator's request is held, its parent (if any) is not.
    op = new_message(
        "command_request",
        source=OPERATOR,
        target=ROOT,
        details={"command": "analyze", "params": {}},
        reply_to=uuid4(),
    )
    a1 = new_message(
        "command_request",
        source=ROOT,
        target=COORD,
        details={"command": "analyze", "params": {}},
        reply_to=op.message_id,
    )
    m3 = a1.reply("command_result", {"result": 1, "handled_by": COORD})
    answer = op.reply("command_result", {"result": 1, "handled_by": ROOT})
    for message, action in ((op, "received"), (a1, "sent"), (m3, "received"), (answer, "sent")):
        await memory.record_message(message, action)
    chain = await memory.trace(m3.message_id)
    assert [r["message_id"] for r in chain] == [str(m.message_id) for m in (op, a1, m3, answer)]
    assert str(SPEC_A) not in str(chain)


async def test_trace_survives_a_forged_reply_to_cycle(memory: VOXAgentMemory) -> None:
    a, b = uuid4(), uuid4()
    await memory.record(
        "message", "received", ROOT, COORD, {"message_id": str(a), "reply_to": str(b)}
    )
    await memory.record(
        "message", "received", ROOT, COORD, {"message_id": str(b), "reply_to": str(a)}
    )
    async with asyncio.timeout(5):
        chain = await memory.trace(a)
    assert {r["message_id"] for r in chain} == {str(a), str(b)}
