"""A forwarded job's note and client address never reach a file of the coordinator's."""

from __future__ import annotations

import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

from tests.kits.agentkit import wait_for
from tests.kits.freelancekit import Fixture, drop, fleet_fixture, job_mail, seed_fleet

__all__ = ["fleet_fixture", "seed_fleet"]  # the fixtures this module borrows

# Searched case-insensitively: the note's client name and the sender's address.
SECRETS = (b"netwire", b"ana@", b"note_to_human", b"o-26-xxxxx")


def leaks(state_dir: Path) -> list[str]:
    """Return every file of the state dir (the WAL included) holding any secret, any case."""
    found = []
    for path in sorted(state_dir.rglob("*")):
        if path.is_file():
            data = path.read_bytes().lower()
            found += [f"{path.name}: {s.decode()}" for s in SECRETS if s in data]
    return found


def outbox_size(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("SELECT count(*) FROM outbox").fetchone()[0])


async def test_no_file_of_the_coordinator_holds_the_note_before_or_after_the_ack(
    fleet_fixture: Fixture,
) -> None:
    f = fleet_fixture
    coordinator_dir = f.tmp / "coordinator"
    async with AsyncExitStack() as stack:
        # The root is not up yet: the coordinator's notification waits, unacknowledged.
        await f.start(stack, ["coordinator", "specialist_a"])
        drop(f.intake, "job-1.eml", job_mail())
        await wait_for(lambda: any(r["action"] == "notified" for r in f.ledger_rows("coordinator")))
        assert outbox_size(coordinator_dir / "logs.db") == 1
        assert (coordinator_dir / "logs.db-wal").exists()
        assert leaks(coordinator_dir) == []
        # The root comes up, gets the re-send and acknowledges it: the outbox empties.
        await f.start(stack, ["root"])
        await wait_for(lambda: len(f.inbox()) == 1, timeout=20)
        await wait_for(lambda: outbox_size(coordinator_dir / "logs.db") == 0)
        assert leaks(coordinator_dir) == []
    # The whole message still reached the human, from memory, note and address included.
    [entry] = f.inbox()
    assert entry["message_source"] == "ana@netwire.example"
    assert "Client: Netwire" in entry["details"]["note_to_human"]
    assert leaks(coordinator_dir) == []


async def test_message_source_is_a_keyed_digest_unless_clear_text_is_asked_for(
    tmp_path: Path,
) -> None:
    from uuid import uuid4

    from vox_mqtt.fleet.config import AgentSection
    from vox_mqtt.ledger.store import VOXAgentMemory
    from vox_mqtt.protocol.messages import new_message

    message = new_message(
        "data_request",
        source=uuid4(),
        target=uuid4(),
        details={"subject": "invoices"},
        message_source="ana@netwire.example",
    )
    digests = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        async with VOXAgentMemory(tmp_path / name / "logs.db") as ledger:
            await ledger.record_message(message, "received")
            await ledger.record_message(message, "duplicate")
            rows = await ledger.get_recent()
        assert rows[0]["details"]["message_source"] == rows[1]["details"]["message_source"]
        digests.append(rows[0]["details"]["message_source"])
        assert leaks(tmp_path / name) == []
        assert oct((tmp_path / name / "logs.key").stat().st_mode & 0o777) == "0o600"
    # Each ledger has its own key: digests do not link one agent's rows to another's.
    assert digests[0].startswith("hmac:")
    assert digests[0] != digests[1]
    clear = tmp_path / "clear"
    clear.mkdir()
    async with VOXAgentMemory(clear / "logs.db", clear_sources=True) as ledger:
        await ledger.record_message(message, "received")
        [row] = await ledger.get_recent()
    assert row["details"]["message_source"] == "ana@netwire.example"
    assert not (clear / "logs.key").exists()
    section = AgentSection.model_validate(
        {
            "name": "a",
            "id": str(uuid4()),
            "master_id": str(uuid4()),
            "state_dir": "/x",
            "ledger_clear_sources": True,
        }
    )
    assert section.ledger_clear_sources is True


async def test_an_acknowledged_outbox_entry_is_overwritten_in_the_file(tmp_path: Path) -> None:
    from uuid import uuid4

    from vox_mqtt.ledger.store import VOXAgentMemory
    from vox_mqtt.protocol.messages import new_message, serialize

    marker = "ZQX-OUTBOX-MARKER"
    message = new_message(
        "job_detected",
        source=uuid4(),
        target=uuid4(),
        details={
            "start_time": "2026-01-12T09:00:00+00:00",
            "end_time": "2026-01-12T10:00:00+00:00",
            "estimated_effort_minutes": 30,
            "price": {"currency": "USD", "value": 10},
            "reference": marker,  # payload text the ledger rows never keep
        },
    )
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path) as ledger:
        await ledger.record_message(message, "sent", outbox=("t", serialize(message)))
        assert marker.encode() in (tmp_path / "logs.db-wal").read_bytes()
        await ledger.outbox_done(message.message_id)
        # The writing connection lives on the ledger's writer thread: ask it there.
        thread = ledger._thread
        assert thread is not None
        db = thread.db
        assert db is not None
        pragma = await thread.call(lambda: db.execute("PRAGMA secure_delete").fetchall())
        assert list(pragma) == [(1,)]
    # Closed: the WAL is folded back and the freed page was zeroed, not left readable.
    assert not (tmp_path / "logs.db-wal").exists()
    assert marker.encode() not in path.read_bytes()
