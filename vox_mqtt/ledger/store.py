"""The ledger: an agent's append-only, hash-chained SQLite record (VOXAgentMemory, seed 003)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Self
from uuid import UUID

import aiosqlite

from vox_mqtt.ledger import _lifecycle, _queries
from vox_mqtt.ledger._errors import ledger_error, sqlite_errors
from vox_mqtt.ledger._index import ReceivedIndex
from vox_mqtt.ledger._queries import VerifyReport, trace_chain, verify_chain
from vox_mqtt.ledger._resume import delegated_commands
from vox_mqtt.ledger._rows import Received, Values, make_row, message_row
from vox_mqtt.ledger._schema import (
    _ALL,
    _HEAD,
    _HELD_ANSWER,
    _INTERRUPTED,
    _PENDING,
    _PROMOTED,
    _SCHEMA,
    _TRIGGERS_VERSION,
    _UPGRADE,
    GENESIS_HASH,
    SCHEMA_VERSION,
    WITNESS_ACTION,
    WITNESS_EVENT,
    _chain_hash,
    _id_text,
    _outbox_payload,
    _row_dict,
    _scrub,
)
from vox_mqtt.ledger._sources import SourceKeeper
from vox_mqtt.ledger._writer import (
    SYNC_MODES,
    Head,
    LedgerSync,
    Pending,
    WriterThread,
    open_writer,
    write_batch,
)
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.privatefs import private_file
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage

__all__ = [
    "GENESIS_HASH",
    "LedgerSync",
    "VOXAgentMemory",
    "VerifyReport",
]


# Rows nothing waits for (an ack's "received") wait this long for a batch to join.
_LATER = 0.02
_RECEIVED = LedgerAction.RECEIVED  # has_message's default: the dedupe check


class VOXAgentMemory:
    """An agent's ledger of message-flow events: durable, append-only, tamper-evident."""

    def __init__(
        self,
        path: str | Path,
        *,
        commit_window: float = 0.002,
        max_batch: int = 1000,
        read_only: bool = False,
        sync: LedgerSync = "full",
        clear_sources: bool = False,
        source_key: bytes | None = None,
    ) -> None:
        if max_batch < 1 or commit_window < 0:
            raise ValueError("max_batch must be >= 1 and commit_window >= 0")
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
        self.path = Path(path)
        self.read_only = read_only
        self.sync = sync
        self._window = commit_window
        self._max_batch = max_batch
        self._thread: WriterThread | None = None  # owns the writing connection
        self._reader: aiosqlite.Connection | None = None
        self._guard: asyncio.Task[None] | None = None
        self._init_lock = asyncio.Lock()
        self._closed = False
        self._commits = 0
        # Records wait here, on the loop, while the previous batch commits (grouping: _flush).
        self._buffer: list[Pending] = []
        self._in_flight = False
        self._flush_handle: asyncio.Handle | None = None
        self._flush_later = False  # the handle is the timer of rows nothing waits for
        self._drain_waiters: list[asyncio.Future[None]] = []
        # (last row id, its hash) after this writer's last commit: the next batch chains onto
        # it on the loop; one writer per ledger (docs/ledger.md): `head()` needs no read.
        self.written_head: Head | None = None
        self._received = ReceivedIndex()  # answers has_message(..., emitted_at=...)
        self.on_commit: Callable[[int, float], None] | None = None  # (rows, s) per commit
        # Why the last commit failed, while the file cannot take writes; None once one works.
        self.write_failure: str | None = None
        # message_source may name a client: kept as a keyed digest unless asked for in clear.
        self.clear_sources = clear_sources
        self._sources = SourceKeeper(clear=clear_sources, key=source_key)  # digest, seal

    @property
    def commit_count(self) -> int:
        """Return how many transactions have been committed by this instance."""
        return self._commits

    async def init_db(self) -> None:
        """Open the ledger, creating the schema on first use; safe to call twice."""
        async with self._init_lock:
            if self._closed:
                raise LedgerError(f"ledger {self.path} is closed")
            if self._reader is not None:
                return
            try:
                await self._open()
            except BaseException:
                await self._close_connections()
                raise

    async def _open(self) -> None:
        if self.path.is_dir() or not self.path.parent.is_dir():
            raise LedgerError(f"ledger {self.path}: not a file in an existing directory")
        if self.read_only and not self.path.is_file():
            raise LedgerError(f"no ledger at {self.path}")
        # mode=rw never creates a missing file (and falls back to reading a write-protected
        # one); unlike mode=ro it lets the last connection fold the WAL back on close.
        if self.read_only:
            where = self.path.resolve().as_uri() + "?mode=rw"
            with sqlite_errors(self.path, "cannot open"):
                db = await aiosqlite.connect(where, uri=True, isolation_level=None)
                self._reader = db
                await db.execute("PRAGMA busy_timeout = 10000")
                await db.execute("PRAGMA query_only = ON")
            await self._check_schema(db, create=False)
            # A reader beside the agent opens what the outbox keeps sealed with its key.
            with contextlib.suppress(LedgerError):
                self._sources.load_key(self.path, create=False)
            return None
        try:
            # SQLite gives the -wal and -shm files the database file's own mode.
            private_file(self.path)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path}: cannot open: {exc.strerror}") from None
        self._thread = WriterThread(f"ledger {self.path.name}")
        self._thread.start()
        thread = self._thread
        with sqlite_errors(self.path, "cannot open"):
            self.written_head, received = await thread.call(
                lambda: open_writer(thread, self.path, SYNC_MODES[self.sync], self._received.load)
            )
            self._reader = await aiosqlite.connect(self.path, isolation_level=None)
            await self._reader.execute("PRAGMA query_only = ON")
        self._sources.load_key(self.path, create=True)
        for message_id, emitted in received:
            self._received.add(message_id, emitted)
        self._guard = asyncio.create_task(self._watch(), name=f"ledger {self.path}")

    async def _watch(self) -> None:
        """Wait to be cancelled: if asyncio.run ends without close(), release the ledger."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if not self._closed:
                self._closed = True
                await self._close_connections()
            raise

    async def _check_schema(self, db: aiosqlite.Connection, *, create: bool) -> None:
        with sqlite_errors(self.path, "not a vox ledger"):
            found = await db.execute_fetchall("SELECT name FROM sqlite_master WHERE type='table'")
            tables = {row[0] for row in found}
            if not {"logs", "ledger_meta"} <= tables:
                if tables or not create:
                    found_text = f"its tables: {', '.join(sorted(tables))}" if tables else "empty"
                    raise LedgerError(f"ledger {self.path}: not a vox ledger ({found_text})")
                await db.executescript(_SCHEMA)
            elif create and not await db.execute_fetchall(_TRIGGERS_VERSION):
                # A ledger from before the insert triggers: add them, once. A trigger dropped
                # from a newer file is never put back here; verify() reports it.
                await db.executescript(_UPGRADE)
            meta = await db.execute_fetchall("SELECT value FROM ledger_meta WHERE key='schema'")
        if (version := next((row[0] for row in meta), None)) != SCHEMA_VERSION:
            raise LedgerError(f"{self.path} has ledger schema {version!r}, not {SCHEMA_VERSION!r}")

    async def close(self) -> None:
        """Write every queued record, then close the database."""
        async with self._init_lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self.settled()
            finally:
                await self._close_connections()
                if self._guard is not None:
                    self._guard.cancel()

    async def settled(self) -> None:
        """Wait until each record queued before this call committed (or failed), so another
        connection reads it: an answer given before its row committed (agent/inbound.py)."""
        last = self._buffer[-1].future if self._buffer else None  # batches commit in order
        while self._thread is not None and (self._in_flight or self._buffer):
            if not self._in_flight:
                self._flush()
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter
            if last is None or last.done():
                return  # the batch in flight at the call, or the last one queued, committed

    async def _close_connections(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            await thread.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            with sqlite_errors(self.path, "cannot close"):
                await reader.close()

    async def __aenter__(self) -> Self:
        await self.init_db()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def record(
        self,
        event_type: str,
        action: str,
        source: UUID | str | None,
        target: UUID | str | None,
        details: dict[str, Any],
    ) -> int:
        """Append one event (the seed 003 call) and return its row id once it is durable."""
        if not isinstance(details, Mapping):
            raise LedgerError(f"details must be a dict, not {type(details).__name__}")
        clean = _scrub(details)
        # Well-known keys also fill their indexed columns, so the seed call is findable.
        meta = {
            column: _id_text(value)
            for key, column in _PROMOTED.items()
            if isinstance(value := clean.get(key), str | UUID)
        }
        return await self._submit([make_row(event_type, action, source, target, clean, meta)])

    async def record_message(
        self,
        message: VOXMessage,
        action: LedgerAction,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        topic: str | None = None,
        outbox: tuple[str, bytes] | None = None,
        outbox_for: VOXMessage | None = None,
        outbox_done: UUID | None = None,
        replay_until: float | None = None,
        then: Iterable[tuple[VOXMessage, LedgerAction, str | None]] = (),
        queued: Callable[[], None] | None = None,
    ) -> int:
        """Record a message's metadata (never its free text) under an action such as received.

        With outbox=(topic, payload), also keep the whole message (or outbox_for, one of the
        `then` messages) until outbox_done(); with outbox_done=ID, forget that sent message in
        the same transaction; with replay_until too, it is an answer held for replay until
        then (`held_answer`) instead. `then` rows, as (message, action, outcome), commit in that
        same transaction after this one (what each such grouping still lets a restart prove is
        in docs/ledger.md). `queued` is called once the rows are queued, before they are
        durable, in the same turn of the loop. Returns the first id.
        """
        if self._reader is None:
            await self.init_db()  # the digest key is read when the ledger opens
        source = self.stored_source(message.message_source)
        rows = [message_row(message, source, action, outcome, reason, topic)]
        rows += [
            message_row(other, self.stored_source(other.message_source), what, result, None, None)
            for other, what, result in then
        ]
        kept = held = replay = None
        if outbox is not None:  # the origin's source sealed, for a re-send after a restart
            keep = message if outbox_for is None else outbox_for
            sealed = self._sources.seal(origin := keep.message_source, self.path)
            kept = (str(keep.message_id), outbox[0], _outbox_payload(outbox[1], origin, sealed))
            if replay_until is not None and keep.reply_to is not None:
                replay = (str(keep.reply_to), kept[1], kept[2], replay_until)
                kept = None
        if message.type == MSG_COMMAND_REQUEST and action == LedgerAction.RECEIVED:
            # Kept until it starts or ends: a restart resumes (or adopts) it with its origin's.
            held = (str(message.message_id), self._sources.seal(message.message_source, self.path))
        done = None if outbox_done is None else str(outbox_done)
        return await self._submit(
            rows, outbox=kept, outbox_done=done, held=held, replay=replay, queued=queued
        )

    def stored_source(self, message_source: str) -> str:
        """Return message_source as this ledger stores it: a keyed digest, or clear if asked."""
        return self._sources.stored(message_source, self.path)

    def record_received_later(
        self, message: VOXMessage, *, topic: str | None, outbox_done: UUID | None
    ) -> asyncio.Future[int]:
        """Queue a "received" row that nothing waits for (an ack's) without forcing a commit.

        It commits with the next batch, or after _LATER seconds if none comes; the returned
        future says when. The ledger must be open.
        """
        if self._thread is None or self._closed or self.read_only:
            raise LedgerError(f"ledger {self.path} is not open for writing")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        source = self.stored_source(message.message_source)
        values, received = message_row(message, source, LedgerAction.RECEIVED, None, None, topic)
        done = None if outbox_done is None else str(outbox_done)
        pending = Pending([values], future, None, done, None if received is None else [received])
        self._enqueue(pending, urgent=False)
        return future

    async def outbox_done(self, message_id: UUID) -> None:
        """Forget a sent message once it is acknowledged (or given up on)."""
        if not self._closed and self._thread is not None:
            await self._submit([], outbox_done=str(message_id))

    async def held_answer(self, request_id: UUID) -> tuple[bytes, float] | None:
        """Return a received command's answer held for replay, and until when (a Unix time)."""
        found = await self._fetch(_HELD_ANSWER, (_id_text(request_id),))
        unseal = self._sources.unseal_payload
        return next(((unseal(bytes(p), self.path), float(until)) for p, until in found), None)

    async def pending_outbox(self) -> list[tuple[str, str, bytes]]:
        """Return the sent messages never acknowledged: (message_id, topic, payload)."""
        await self.init_db()
        assert self._reader is not None
        with sqlite_errors(self.path, "cannot read"):
            rows = await self._reader.execute_fetchall(
                "SELECT message_id, topic, payload FROM outbox ORDER BY rowid"
            )
        unseal = self._sources.unseal_payload
        return [(str(r[0]), str(r[1]), unseal(bytes(r[2]), self.path)) for r in rows]

    async def record_rejected(
        self,
        raw: bytes,
        reason: str,
        *,
        topic: str | None,
        source: UUID | None,
        message_id: UUID | None,
    ) -> int:
        """Record input that did not parse or verify by its size and digest, never its bytes."""
        details = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "topic": topic}
        meta = {"message_id": _id_text(message_id), "outcome": "rejected", "reason": reason}
        row = make_row("message", LedgerAction.REJECTED, source, None, details, meta)
        return await self._submit([row])

    async def _submit(
        self,
        rows: list[tuple[Values, Received | None]],
        *,
        outbox: tuple[str, str, bytes] | None = None,
        outbox_done: str | None = None,
        held: tuple[str, str] | None = None,
        replay: tuple[str, str, bytes, float] | None = None,
        queued: Callable[[], None] | None = None,
    ) -> int:
        """Queue rows that commit together; return the first one's id once they are durable."""
        if self._reader is None:  # set once the writer is open too
            await self.init_db()
        if self.read_only:
            raise LedgerError(f"ledger {self.path} is open read-only")
        # No await between init_db's closed check and here: close() cannot slip in between.
        if self._closed:
            raise LedgerError(f"ledger {self.path} is closed")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        received = [seen for _, seen in rows if seen is not None] or None
        values = [row for row, _ in rows]
        self._enqueue(Pending(values, future, outbox, outbox_done, received, held, replay))
        if queued is not None:
            queued()
        return await future

    def _enqueue(self, pending: Pending, *, urgent: bool = True) -> None:
        self._buffer.append(pending)
        if self._in_flight:
            return  # _written hands the buffer over when the commit in flight ends
        if len(self._buffer) >= self._max_batch:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()
            return
        if self._flush_handle is not None:
            if not (urgent and self._flush_later):
                return
            self._flush_handle.cancel()  # an urgent record takes the waiting ones along
        loop = asyncio.get_running_loop()
        self._flush_later = not urgent
        if not urgent:
            self._flush_handle = loop.call_later(_LATER, self._flush)
        elif self._window > 0:
            self._flush_handle = loop.call_later(self._window, self._flush)
        else:
            # call_soon still collects every record made in this turn of the loop.
            self._flush_handle = loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Chain the next batch onto the cached head and hand it to the writer thread at once."""
        self._flush_handle = None
        if self._in_flight or not self._buffer or self._thread is None:
            return
        batch = self._buffer[: self._max_batch]
        del self._buffer[: self._max_batch]
        rows, added, removed, held, replay = [], [], [], [], []
        last_id, prev = self.written_head or (0, GENESIS_HASH)
        for pending in batch:
            for values in pending.rows:
                content = (last_id := last_id + 1, *values)
                digest = _chain_hash(prev, content)
                rows.append((*content, prev, digest))
                prev = digest
            if pending.outbox is not None:
                added.append(pending.outbox)
            if pending.outbox_done is not None:
                removed.append((pending.outbox_done,))
            held += [pending.held] if pending.held is not None else []
            replay += [pending.replay] if pending.replay is not None else []
        thread = self._thread
        chained = self.written_head is not None

        def job() -> tuple[list[tuple[Any, ...]], Head | None]:
            assert thread.db is not None
            return write_batch(thread.db, rows, added, removed, chained, held, replay)

        self._in_flight = True
        thread.submit(job, functools.partial(self._written, batch, time.perf_counter()))

    def _written(self, batch: list[Pending], started: float, ok: bool, outcome: Any) -> None:
        """Settle a batch's callers (on the loop), then hand over what queued meanwhile."""
        self._in_flight = False
        if ok:
            rows, head = outcome
            if head is not None:
                self.written_head = head
            self._commits += 1
            if self.on_commit is not None:
                self.on_commit(len(rows), time.perf_counter() - started)
            self.write_failure = None
            at = 0
            for pending in batch:
                row_id = rows[at][0] if pending.rows else 0
                at += len(pending.rows)
                for seen in pending.received or ():
                    self._received.add(*seen)
                if not pending.future.done():
                    pending.future.set_result(row_id)
        else:
            self.written_head = None  # re-read inside the next transaction
            error = ledger_error(self.path, outcome, "cannot write")
            if isinstance(outcome, sqlite3.OperationalError | OSError):
                self.write_failure = str(error)  # the file cannot take writes (disk full ...)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
        if self._buffer:
            self._flush()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _fetch(self, sql: str, params: Iterable[Any] = ()) -> Iterable[Any]:
        await self.init_db()
        assert self._reader is not None
        with sqlite_errors(self.path, "cannot read"):
            return await self._reader.execute_fetchall(sql, tuple(params))

    async def _read(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        return [_row_dict(row) for row in await self._fetch(sql, params)]

    async def get_recent(self, limit: int = 10) -> list[dict[str, Any]]:
        """Return the newest rows first, as dicts."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise LedgerError(f"limit must be a non-negative integer, not {limit!r}")
        return await self._read(f"SELECT {_ALL} FROM logs ORDER BY id DESC LIMIT ?", (limit,))

    async def has_message(
        self, message_id: UUID, action: LedgerAction = _RECEIVED, *, emitted_at: str | None = None
    ) -> bool:
        """Tell whether a message id was already recorded under an action (dedupe).

        Given the message's emitted_at, a "received" check is answered from memory: every
        copy of a message carries the same emitted_at, and the index holds every id received
        with an emission time after its floor (loaded at open, kept up at each commit). Older
        messages, other actions and read-only ledgers are looked up in the database.
        """
        key = _id_text(message_id) or ""
        if (
            action == LedgerAction.RECEIVED
            and emitted_at is not None
            and self._thread is not None
            and self._received.knows(emitted_at)
        ):
            return key in self._received
        sql = "SELECT 1 FROM logs WHERE message_id = ? AND action = ? LIMIT 1"
        return bool(await self._fetch(sql, (key, action)))

    async def find(self, message_id: UUID) -> list[dict[str, Any]]:
        """Return every row about a message id, oldest first."""
        sql = f"SELECT {_ALL} FROM logs WHERE message_id = ? ORDER BY id"
        return await self._read(sql, (_id_text(message_id),))

    async def pending_commands(self) -> list[dict[str, Any]]:
        """Return received command_requests never started, finished nor answered (+ origin)."""
        return self._sources.with_origins(await self._read(_PENDING), await self._held(), self.path)

    async def _held(self) -> list[tuple[str, str]]:
        rows = await self._fetch("SELECT message_id, source FROM held")
        return [(str(r[0]), str(r[1])) for r in rows]

    async def interrupted_commands(self) -> list[dict[str, Any]]:
        """Return commands started or delegated but neither finished nor answered."""
        return await self._read(_INTERRUPTED)

    async def delegated_commands(self) -> list[dict[str, Any]]:
        """Return commands delegated and not answered, with `downstream` and their origin."""
        rows = await delegated_commands(self._read)
        return self._sources.with_origins(rows, await self._held(), self.path)

    async def trace(self, message_id: UUID) -> list[dict[str, Any]]:
        """Rebuild the reply_to chain around a message: one row per message, in ledger order."""
        return await trace_chain(self._read, message_id)

    async def head(self) -> tuple[int, str]:
        """Return the newest row's id and hash ((0, the genesis hash) when empty)."""
        found = await self._fetch(_HEAD)
        return next(((int(r[0]), str(r[1])) for r in found), (0, GENESIS_HASH))

    async def row_hashes(self, ids: Iterable[int]) -> dict[int, str]:
        """Return the stored hash of each of these rows that exists."""
        await self.init_db()
        assert self._reader is not None
        with sqlite_errors(self.path, "cannot read"):
            return await _queries.row_hashes(self._reader, ids)

    async def request_rows(self, request_id: UUID) -> _lifecycle.RequestRows:
        """Return a request's own rows, the requests sent down for it, the cancels naming it."""
        return await _lifecycle.request_rows(self._read, str(request_id))

    async def doors(self, request_id: UUID) -> list[dict[str, Any]]:
        """Return the door rows naming a request, oldest first: what came through which door."""
        return await self._read(_lifecycle.DOORS_OF, (str(request_id),))

    async def remembered_cancels(self, limit: int = 10_000) -> list[str]:
        """Return the request ids the newest cancel_requests received named (docs/ledger.md)."""
        return await _lifecycle.remembered_cancels(self._fetch, limit)

    async def untold_children(self, rows: int = 100_000) -> list[tuple[str, str]]:
        """Return (child, downstream request) of canceled requests whose child was not told."""
        return await _lifecycle.untold_children(self._fetch, (await self.head())[0] - rows)

    async def record_witness(self, child: UUID, head: tuple[int, str], *, final: bool) -> int:
        """Record a child's ledger head (row, hash) as its status said it (final: none follows)."""
        details = {"row": head[0], "hash": head[1], "final": final}
        return await self.record(WITNESS_EVENT, WITNESS_ACTION, child, None, details)

    async def witnessed_heads(self, child: UUID | None = None) -> list[dict[str, Any]]:
        """Return the ledger heads this ledger witnessed, oldest first (of one child if named)."""
        where = None if child is None else _id_text(child)
        return await self._read(*_queries.witnessed_query(where))

    async def verify(self) -> VerifyReport:
        """Recompute the hash chain and report the first row that does not match."""
        await self.init_db()
        assert self._reader is not None
        with sqlite_errors(self.path, "cannot verify"):
            return await verify_chain(self._reader)
