"""The ledger's writer on real SQLite files: sync modes, the dedupe index, a second writer."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from tests.kits.ledgerkit import acknowledged_before_sigkill, assert_each_kept
from vox_mqtt.memory import VOXAgentMemory
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import VOXMessage, new_message, serialize

ROOT, COORD = uuid4(), uuid4()


def request(emitted_at: str | None = None) -> VOXMessage:
    message = new_message(
        "command_request", source=ROOT, target=COORD, details={"command": "x", "params": {}}
    )
    return message if emitted_at is None else message.model_copy(update={"emitted_at": emitted_at})


async def writer_pragma(ledger: VOXAgentMemory, name: str) -> int:
    """Read a PRAGMA on the writing connection itself (it is per connection)."""
    thread = ledger._thread
    assert thread is not None
    assert thread.db is not None
    db = thread.db
    return int(await thread.call(lambda: db.execute(f"PRAGMA {name}").fetchone()[0]))


@pytest.mark.parametrize(("sync", "level"), [("full", 2), ("normal", 1)])
async def test_ledger_sync_sets_the_writers_synchronous_level(
    tmp_path: Path, sync: str, level: int
) -> None:
    async with VOXAgentMemory(tmp_path / "logs.db", sync=sync) as ledger:  # type: ignore[arg-type]
        assert await writer_pragma(ledger, "synchronous") == level
        assert await ledger.record("m", "r", None, None, {}) == 1


def test_an_unknown_sync_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="full, normal"):
        VOXAgentMemory("logs.db", sync="off")  # type: ignore[arg-type]


CHILD = """
import asyncio, sys, uuid
from vox_mqtt.memory import VOXAgentMemory

async def main():
    ledger = VOXAgentMemory(sys.argv[1], sync=sys.argv[2])
    while True:
        mids = [str(uuid.uuid4()) for _ in range(20)]
        rows = await asyncio.gather(
            *(ledger.record("message", "received", None, None, {"message_id": m}) for m in mids)
        )
        for row, mid in zip(rows, mids):
            print(row, mid, flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_both_sync_modes_survive_a_process_kill(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "logs.db"
    acknowledged = await acknowledged_before_sigkill(CHILD, str(path), sync, count=300)
    async with VOXAgentMemory(path) as ledger:
        await assert_each_kept(ledger, acknowledged)
        assert (await ledger.verify()).ok


async def test_the_dedupe_index_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    recent = request()
    old = request((datetime.now(UTC) - timedelta(days=2)).isoformat())
    async with VOXAgentMemory(path) as ledger:
        for message in (recent, old):
            assert not await ledger.has_message(message.message_id, emitted_at=message.emitted_at)
            await ledger.record_message(message, "received")
            assert await ledger.has_message(message.message_id, emitted_at=message.emitted_at)
    async with VOXAgentMemory(path) as again:
        # The recent one is answered from the index loaded at open, the old one from the file.
        assert str(recent.message_id) in again._received
        assert str(old.message_id) not in again._received
        for message in (recent, old):
            assert await again.has_message(message.message_id, emitted_at=message.emitted_at)
            assert await again.has_message(message.message_id)
            assert not await again.has_message(message.message_id, "started")
        for emitted_at in (recent.emitted_at, old.emitted_at):
            assert not await again.has_message(uuid4(), emitted_at=emitted_at)


async def test_a_failed_commit_never_enters_the_dedupe_index(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    message = request()
    async with VOXAgentMemory(path) as ledger:
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON logs WHEN NEW.action = 'received'"
                " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        with pytest.raises(LedgerError, match="poisoned"):
            await ledger.record_message(message, "received")
        assert not await ledger.has_message(message.message_id, emitted_at=message.emitted_at)


async def test_a_second_writer_never_forks_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path) as first, VOXAgentMemory(path) as second:
        for n in range(5):
            a = await first.record("m", "a", None, None, {"n": n})
            b = await second.record("m", "b", None, None, {"n": n})
            assert b == a + 1
        together = await asyncio.gather(
            *(ledger.record("m", "c", None, None, {}) for ledger in (first, second) * 20)
        )
        assert sorted(together) == list(range(11, 51))
        report = await first.verify()
        assert report.ok, report.problem
        assert report.rows == 50


async def test_grouped_rows_commit_together_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    message = request()
    ack = message.acknowledgement()
    async with VOXAgentMemory(path) as ledger:
        await ledger.record_message(message, "sent", outbox=("t", serialize(message)))
        assert len(await ledger.pending_outbox()) == 1
        commits = ledger.commit_count
        first = await ledger.record_message(
            ack, "received", outbox_done=message.message_id, then=[(message, "completed", None)]
        )
        assert ledger.commit_count == commits + 1
        assert first == 2
        assert [r["action"] for r in await ledger.find(message.message_id)] == ["sent", "completed"]
        assert await ledger.pending_outbox() == []
        # A row that fails takes its group down with it: no half of it is ever on disk.
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON logs WHEN NEW.action = 'started'"
                " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        other = request()
        with pytest.raises(LedgerError, match="poisoned"):
            await ledger.record_message(other, "received", then=[(other, "started", None)])
        assert await ledger.find(other.message_id) == []
        assert not await ledger.has_message(other.message_id, emitted_at=other.emitted_at)
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER poison")
        assert (await ledger.verify()).ok


async def test_an_acks_row_joins_the_next_commit_or_commits_alone_soon(tmp_path: Path) -> None:
    async with VOXAgentMemory(tmp_path / "logs.db", commit_window=0) as ledger:
        sent = request()
        await ledger.record_message(sent, "sent", outbox=("t", serialize(sent)))
        ack = sent.acknowledgement()
        commits = ledger.commit_count
        later = ledger.record_received_later(ack, topic="t", outbox_done=sent.message_id)
        await asyncio.sleep(0)
        assert not later.done()  # it did not force a commit of its own
        other = request()
        await ledger.record_message(other, "received")
        assert later.done()
        assert ledger.commit_count == commits + 1  # both rows, one transaction
        assert await ledger.pending_outbox() == []
        assert await ledger.has_message(ack.message_id, emitted_at=ack.emitted_at)
        alone = ledger.record_received_later(request(), topic="t", outbox_done=None)
        async with asyncio.timeout(5):
            assert await alone > 0  # with nothing to join, it commits after a moment


@pytest.mark.parametrize(
    "details",
    [
        {"command": "x", "params": {"a": [1, {"b": "c"}], "é": "ü"}},
        {"command": "x", "params": {"deep": {"note_to_human": "secret", "keep": 1}}},
        {"command": "x", "params": {"text": "a value that says note_to_human is fine"}},
        {"command": "x", "params": {"id": ROOT}},
    ],
)
def test_a_rows_details_are_the_scrubbed_ones_with_or_without_the_fast_path(
    details: dict[str, object],
) -> None:
    from vox_mqtt.ledger._rows import _details_text
    from vox_mqtt.ledger._schema import _canonical, _scrub

    made = _details_text(details)
    assert (made if isinstance(made, str) else _canonical(made)) == _canonical(_scrub(details))


async def test_settled_waits_for_what_was_queued_so_another_connection_reads_it(
    tmp_path: Path,
) -> None:
    # A caller may be shown an answer before its row commits (agent/inbound.py, _commit);
    # a reader on its own connection that waits on settled() first reads that row.
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path, commit_window=600.0) as memory:
        rows = [memory.record("test", f"row{n}", None, None, {}) for n in range(3)]
        queued = [asyncio.ensure_future(row) for row in rows]
        await asyncio.sleep(0)  # each record is in the buffer, its commit 600 s away
        assert not any(task.done() for task in queued)
        async with asyncio.timeout(60):  # far inside the window: settled() commits them
            await memory.settled()
        assert all(task.done() for task in queued)
        async with VOXAgentMemory(path, read_only=True) as reader:
            actions = [row["action"] for row in await reader.get_recent(10)]
        assert actions == ["row2", "row1", "row0"], actions
        await memory.settled()  # nothing queued: returns at once
