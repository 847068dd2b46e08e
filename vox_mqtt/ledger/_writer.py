"""The ledger's writer thread: its own sqlite3 connection, one hand-off per batch of records."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from vox_mqtt.ledger._rows import Received, Values
from vox_mqtt.ledger._schema import (
    _ALL,
    _COLUMNS,
    _HEAD,
    _HELD,
    _LEGACY_ANSWERS,
    _REPLAY,
    _SCHEMA,
    _TRIGGERS_VERSION,
    _UPGRADE,
    GENESIS_HASH,
    SCHEMA_VERSION,
    _chain_hash,
)
from vox_mqtt.ledger.actions import DONE_ACTIONS, LedgerAction
from vox_mqtt.protocol.errors import LedgerError

__all__ = [
    "SYNC_MODES",
    "LedgerSync",
    "Pending",
    "WriterThread",
    "open_writer",
    "rechain",
    "write_batch",
]


@dataclass(slots=True)
class Pending:
    """Rows (none, for an outbox removal alone) that commit together, and who waits for them."""

    rows: list[Values]
    future: asyncio.Future[int]  # the first row's id (0 without rows)
    # The outbox is the one mutable table: a sent message waits there, whole, until it is
    # acknowledged, so a restart can re-send it. It commits with its "sent" row.
    outbox: tuple[str, str, bytes] | None = None  # message_id, topic, payload
    outbox_done: str | None = None  # message_id to remove
    received: list[Received] | None = None  # for the dedupe index, once committed
    held: tuple[str, str] | None = None  # a command's sealed source, until it starts or ends
    # An answer to a received command, whole, held for replay until its request's deadline:
    # (request_id, topic, payload, keep_until as a Unix time).
    replay: tuple[str, str, bytes, float] | None = None


LedgerSync = Literal["full", "normal"]
# What each ledger_sync value survives is in docs/ledger.md ("Durable before acknowledged").
SYNC_MODES: Final[dict[str, str]] = {"full": "FULL", "normal": "NORMAL"}

Head = tuple[int, str]  # (last row id, its hash)
Row = tuple[Any, ...]  # _COLUMNS, then prev_hash and hash
Settle = Callable[[bool, Any], None]
T = TypeVar("T")


class WriterThread:
    """Run jobs on one thread that owns a sqlite3 connection; report each back to the loop.

    A job is a plain function of the connection. The caller's callback runs on the event loop
    through a single call_soon_threadsafe, so a whole batch of records costs one wake-up of
    this thread and one of the loop, whatever the number of statements in it.
    """

    def __init__(self, name: str) -> None:
        self.db: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Settle, Any] | None] = (
            queue.SimpleQueue()
        )
        # A daemon, so a program that never closes its ledger still exits; sqlite's WAL
        # makes an interrupted transaction invisible, as a crash would.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread.start()

    def submit(self, job: Callable[[], Any], settle: Settle) -> None:
        """Run job() on the thread, then settle(ok, result or exception) on the running loop."""
        if self._stopped:
            raise RuntimeError("the ledger writer has stopped")
        self._jobs.put((job, settle, asyncio.get_running_loop()))

    async def call(self, job: Callable[[], Any]) -> Any:
        """Run job() on the thread and return its result (for the rare, non-batched work)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def settle(ok: bool, result: Any) -> None:
            if not future.done():
                (future.set_result if ok else future.set_exception)(result)

        self.submit(job, settle)
        return await future

    async def close(self) -> None:
        """Close the connection on the thread (after the jobs queued before), then stop it."""
        with contextlib.suppress(Exception):
            await self.call(self._close_db)
        self.stop()

    def _close_db(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def stop(self) -> None:
        """Ask the thread to end once the queued jobs are done, closing its connection."""
        if not self._stopped:
            self._stopped = True
            self._jobs.put(None)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, settle, loop = item
            try:
                outcome: tuple[bool, Any] = (True, job())
            except BaseException as exc:  # reported to the caller, never lost in the thread
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(settle, *outcome)
        self._close_db()  # stopped without a closing job: the loop went away


_PER_INSERT = 500  # rows per INSERT statement, at most (SQLite's variable limit may say fewer)
_ROW_MARKS = "(" + ", ".join("?" * (len(_COLUMNS) + 2)) + ")"


@functools.lru_cache(maxsize=64)
def _insert_sql(count: int) -> str:
    return f"INSERT INTO logs ({_ALL}) VALUES " + ", ".join([_ROW_MARKS] * count)


def _insert(db: sqlite3.Connection, rows: Sequence[Row]) -> None:
    """Insert rows with few statements: after each step the thread waits for the GIL again."""
    width = len(_COLUMNS) + 2
    per = max(1, min(_PER_INSERT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width))
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        db.execute(_insert_sql(len(chunk)), [value for row in chunk for value in row])


def rechain(rows: Sequence[Row], head: Head) -> list[Row]:
    """Give rows chained onto a stale head new ids and hashes onto the real one."""
    last_id, prev = head
    out = []
    for row in rows:
        content = (last_id := last_id + 1, *row[1:-2])
        digest = _chain_hash(prev, content)
        out.append((*content, prev, digest))
        prev = digest
    return out


def _hold_legacy_answers(db: sqlite3.Connection) -> None:
    """Move answers to commands from the outbox to the replay table, in one transaction."""
    found = db.execute(_LEGACY_ANSWERS, (time.time(),)).fetchall()
    if not found:
        return
    db.execute("BEGIN IMMEDIATE")
    db.executemany("INSERT OR IGNORE INTO replay VALUES (?, ?, ?, ?)", [r[1:] for r in found])
    db.executemany("DELETE FROM outbox WHERE message_id = ?", [(r[0],) for r in found])
    db.execute("COMMIT")


def open_writer(
    thread: WriterThread, path: Path, synchronous: str, load: Callable[[sqlite3.Connection], T]
) -> tuple[Head, T]:
    """Open the writing connection (on the writer thread); return the head and load(db)."""
    db = thread.db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 10000")
    try:
        found = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        tables = {row[0] for row in found}
        if not {"logs", "ledger_meta"} <= tables:
            if tables:
                listed = ", ".join(sorted(tables))
                raise LedgerError(f"ledger {path}: not a vox ledger (its tables: {listed})")
            db.executescript(_SCHEMA)
        elif not db.execute(_TRIGGERS_VERSION).fetchall():
            # A ledger from before the insert triggers: add them, once. A trigger dropped
            # from a newer file is never put back here; verify() reports it.
            db.executescript(_UPGRADE)
        db.execute(_HELD)  # a ledger from before it gets the table (empty: nothing was held)
        db.executescript(_REPLAY)  # the same for answers held for replay
        _hold_legacy_answers(db)
        meta = db.execute("SELECT value FROM ledger_meta WHERE key='schema'").fetchall()
    except sqlite3.Error as exc:
        raise LedgerError(f"ledger {path}: not a vox ledger: {exc}") from None
    if (version := next((row[0] for row in meta), None)) != SCHEMA_VERSION:
        raise LedgerError(f"{path} has ledger schema {version!r}, not {SCHEMA_VERSION!r}")
    # Freed pages are zeroed, so an outbox entry gone is gone from the file too (some SQLite
    # builds default to it; the ledger does not rely on that).
    db.execute("PRAGMA secure_delete = ON")
    # WAL lets readers run beside the writer; FULL also syncs the WAL at every commit.
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {synchronous}")
    return read_head(db), load(db)


def read_head(db: sqlite3.Connection) -> Head:
    """Return the ledger's last row id and hash (0 and the genesis hash when empty)."""
    found = db.execute(_HEAD).fetchone()
    return (0, GENESIS_HASH) if found is None else (int(found[0]), str(found[1]))


# A delegated command keeps its source held: a restart resumes waiting for its child.
_ENDS: Final = frozenset((LedgerAction.STARTED, *DONE_ACTIONS))
_ANSWERS: Final = frozenset(("command_result", "command_error"))
# Where _released reads a row (laid out as _COLUMNS, then prev_hash and hash).
_ACTION, _MESSAGE_ID, _TYPE, _REPLY_TO = (
    _COLUMNS.index(c) for c in ("action", "message_id", "message_type", "reply_to")
)


def _released(rows: Sequence[Row]) -> list[tuple[str]]:
    """Return the commands these rows start, end or answer: their held sources go."""
    out: list[tuple[str]] = []
    for row in rows:
        if row[_ACTION] in _ENDS and row[_MESSAGE_ID]:
            out.append((str(row[_MESSAGE_ID]),))
        elif row[_ACTION] == LedgerAction.SENT and row[_TYPE] in _ANSWERS and row[_REPLY_TO]:
            out.append((str(row[_REPLY_TO]),))
    return out


def write_batch(
    db: sqlite3.Connection,
    rows: list[Row],
    added: list[tuple[str, str, bytes]],
    removed: list[tuple[str]],
    chained: bool,
    held: Sequence[tuple[str, str]] = (),
    replay: Sequence[tuple[str, str, bytes, float]] = (),
) -> tuple[list[Row], Head | None]:
    """Append rows and change the outbox in one transaction; return the rows as written.

    held: received commands' sealed sources, kept until a row says the command started,
    ended or was answered (`_released`), in the same transaction as that row.
    replay: answers held for replay (request_id, topic, payload, keep_until); those held
    long enough go in the same transaction, so they cost no commit of their own.

    Rows arrive chained onto the head this writer last committed (chained=True). If another
    connection appended meanwhile, the first id collides (ids are explicit and contiguous):
    the batch is then re-chained onto the real head, read inside the write lock.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        if not chained and rows:
            rows = rechain(rows, read_head(db))
        try:
            if rows:
                _insert(db, rows)
        except sqlite3.IntegrityError:
            if not chained or not rows:
                raise
            db.execute("ROLLBACK")
            db.execute("BEGIN IMMEDIATE")
            rows = rechain(rows, read_head(db))
            _insert(db, rows)
        if added:
            db.executemany("INSERT OR REPLACE INTO outbox VALUES (?, ?, ?)", added)
        if removed:
            db.executemany("DELETE FROM outbox WHERE message_id = ?", removed)
        if held:
            db.executemany("INSERT OR IGNORE INTO held VALUES (?, ?)", held)
        if replay:
            db.executemany("INSERT OR REPLACE INTO replay VALUES (?, ?, ?, ?)", replay)
        db.execute("DELETE FROM replay WHERE keep_until < ?", (time.time(),))
        if released := _released(rows):
            db.executemany("DELETE FROM held WHERE message_id = ?", released)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    head = (int(rows[-1][0]), str(rows[-1][-1])) if rows else None
    return rows, head
