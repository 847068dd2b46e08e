"""The ledger: an agent's append-only, hash-chained aiosqlite record (VOXAgentMemory, seed 003)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from uuid import UUID

import aiosqlite

from ._ledgerschema import (
    _ALL,
    _COLUMNS,
    _HEAD,
    _INSERT,
    _INTERRUPTED,
    _KEPT_DETAILS,
    _MAX_REASON,
    _PARENT,
    _PENDING,
    _PROMOTED,
    _SCHEMA,
    _TRIGGERS_FOUND,
    _TRIGGERS_VERSION,
    _UPGRADE,
    APPEND_ONLY,
    DONE_ACTIONS,
    GENESIS_HASH,
    SCHEMA_VERSION,
    STARTED_ACTIONS,
    WITNESS_ACTION,
    WITNESS_EVENT,
    _canonical,
    _chain_hash,
    _id_text,
    _load_key,
    _outbox_payload,
    _row_dict,
    _scrub,
    _source_digest,
    _trigger_problem,
)
from .errors import LedgerError
from .messages import VOXMessage, now_iso
from .privatefs import private_file

__all__ = ["DONE_ACTIONS", "GENESIS_HASH", "STARTED_ACTIONS", "VOXAgentMemory", "VerifyReport"]


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of checking the hash chain and the append-only triggers."""

    ok: bool
    rows: int
    first_bad_row: int | None
    problem: str | None


@dataclass(slots=True)
class _Pending:
    values: tuple[Any, ...] | None  # _COLUMNS without id; None for an outbox removal only
    future: asyncio.Future[int]
    # The outbox is the one mutable table: a sent message waits there, whole, until it is
    # acknowledged, so a restart can re-send it. It commits with its "sent" row.
    outbox: tuple[str, str, bytes] | None = None  # message_id, topic, payload
    outbox_done: str | None = None  # message_id to remove


class VOXAgentMemory:
    """An agent's ledger of message-flow events: durable, append-only, tamper-evident."""

    def __init__(
        self,
        path: str | Path,
        *,
        commit_window: float = 0.002,
        max_batch: int = 1000,
        read_only: bool = False,
        clear_sources: bool = False,
        source_key: bytes | None = None,
    ) -> None:
        if max_batch < 1 or commit_window < 0:
            raise ValueError("max_batch must be >= 1 and commit_window >= 0")
        self.path = Path(path)
        self.read_only = read_only
        self._window = commit_window
        self._max_batch = max_batch
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._writer_task: asyncio.Task[None] | None = None
        self._init_lock = asyncio.Lock()
        self._closed = False
        self._commits = 0
        # (last row id, its hash) as this writer's last commit left them: a commit then costs
        # three round trips to the sqlite thread instead of four (see _write).
        self._head: tuple[int, str] | None = None
        # Told (records written, seconds) after each commit: the agent's metrics.
        self.on_commit: Callable[[int, float], None] | None = None
        # Why the last commit failed, while the file cannot take writes; None once one works.
        self.write_failure: str | None = None
        # message_source may name a client: kept as a keyed digest unless asked for in clear.
        self.clear_sources = clear_sources
        self._source_key = source_key

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
        where = self.path.resolve().as_uri() + "?mode=rw" if self.read_only else str(self.path)
        if not self.read_only:
            try:
                # SQLite gives the -wal and -shm files the database file's own mode.
                private_file(self.path)
            except OSError as exc:
                raise LedgerError(f"ledger {self.path}: cannot open: {exc.strerror}") from None
        with self._errors("cannot open"):
            db = await aiosqlite.connect(where, uri=self.read_only, isolation_level=None)
            await db.execute("PRAGMA busy_timeout = 10000")
        if self.read_only:
            self._reader = db
            await db.execute("PRAGMA query_only = ON")
            return await self._check_schema(db, create=False)
        self._writer = db
        with self._errors("cannot open"):
            # Freed pages are zeroed, so an outbox entry gone is gone from the file too
            # (some SQLite builds default to it; the ledger does not rely on that).
            await db.execute("PRAGMA secure_delete = ON")
        await self._check_schema(db, create=True)
        if not self.clear_sources and self._source_key is None:
            try:
                self._source_key = _load_key(self.path.with_suffix(".key"))
            except (OSError, ValueError) as exc:
                raise LedgerError(f"ledger {self.path}: digest key: {exc}") from None
        with self._errors("cannot open"):
            # WAL lets readers run beside the writer; FULL syncs the WAL on every commit.
            await db.execute("PRAGMA journal_mode = WAL")
            await db.execute("PRAGMA synchronous = FULL")
            self._reader = await aiosqlite.connect(self.path, isolation_level=None)
            await self._reader.execute("PRAGMA query_only = ON")
        self._writer_task = asyncio.create_task(self._write_loop(), name=f"ledger {self.path}")

    async def _check_schema(self, db: aiosqlite.Connection, *, create: bool) -> None:
        with self._errors("not a vox ledger"):
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
                if self._writer_task is not None:
                    self._queue.put_nowait(None)
                    await self._writer_task
            finally:
                await self._close_connections()

    async def _close_connections(self) -> None:
        for db in (self._reader, self._writer):
            if db is not None:
                with self._errors("cannot close"):
                    await db.close()
        self._reader = self._writer = None

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
        return await self._append(event_type, action, source, target, clean, meta)

    async def record_message(
        self,
        message: VOXMessage,
        action: str,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        topic: str | None = None,
        outbox: tuple[str, bytes] | None = None,
    ) -> int:
        """Record a message's metadata (never its free text) under an action such as received.

        With outbox=(topic, payload), also keep the whole message until outbox_done().
        """
        if self._reader is None:
            await self.init_db()  # the digest key is read when the ledger opens
        source = self.stored_source(message.message_source)
        details: dict[str, Any] = {"message_source": source}
        for key in _KEPT_DETAILS.get(message.type, ()):
            if key in message.details:
                details[key] = message.details[key]
        if topic is not None:
            details["topic"] = topic
        meta = {
            "message_id": str(message.message_id),
            "message_type": message.type,
            "reply_to": _id_text(message.reply_to),
            "emitted_at": message.emitted_at,
            "outcome": outcome,
            "reason": reason,
        }
        return await self._append(
            "message",
            action,
            message.source,
            message.target,
            _scrub(details),
            meta,
            outbox=None
            if outbox is None
            else (
                str(message.message_id),
                outbox[0],
                _outbox_payload(outbox[1], message.message_source, source),
            ),
        )

    def stored_source(self, message_source: str) -> str:
        """Return message_source as this ledger stores it: a keyed digest, or clear if asked."""
        if self.clear_sources:
            return message_source[:200]
        if self._source_key is None:
            raise LedgerError(f"ledger {self.path} is not open")
        return _source_digest(self._source_key, message_source)

    async def outbox_done(self, message_id: UUID) -> None:
        """Forget a sent message once it is acknowledged (or given up on)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self._closed:
            self._queue.put_nowait(_Pending(None, future, outbox_done=str(message_id)))
            await future

    async def pending_outbox(self) -> list[tuple[str, str, bytes]]:
        """Return the sent messages never acknowledged: (message_id, topic, payload)."""
        await self.init_db()
        assert self._reader is not None
        with self._errors("cannot read"):
            rows = await self._reader.execute_fetchall(
                "SELECT message_id, topic, payload FROM outbox ORDER BY rowid"
            )
        return [(str(r[0]), str(r[1]), bytes(r[2])) for r in rows]

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
        return await self._append("message", "rejected", source, None, details, meta)

    async def _append(
        self,
        event_type: str,
        action: str,
        source: UUID | str | None,
        target: UUID | str | None,
        details: dict[str, Any],
        meta: Mapping[str, str | None],
        *,
        outbox: tuple[str, str, bytes] | None = None,
    ) -> int:
        for name, word in (("event_type", event_type), ("action", action)):
            if not isinstance(word, str) or not 0 < len(word) <= 64:
                raise LedgerError(f"{name} must be a string of 1 to 64 characters, not {word!r}")
        row = {**meta, "recorded_at": now_iso(), "event_type": event_type, "action": action}
        row.update(source=_id_text(source), target=_id_text(target))
        if (reason := meta.get("reason")) is not None:
            row["reason"] = reason[:_MAX_REASON]
        try:
            row["details"] = _canonical(details)
            # A field that is not UTF-8 would fail inside the batch and take its neighbours down.
            "".join(v for v in row.values() if isinstance(v, str)).encode()
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"cannot record {action!r}: {exc}") from None
        values = tuple(row.get(column) for column in _COLUMNS[1:])
        await self.init_db()
        if self.read_only:
            raise LedgerError(f"ledger {self.path} is open read-only")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # No await between init_db's closed check and here: close() cannot slip in between.
        if self._closed:
            raise LedgerError(f"ledger {self.path} is closed")
        self._queue.put_nowait(_Pending(values, future, outbox=outbox))
        return await future

    async def _write_loop(self) -> None:
        """Drain the queue in batches: one transaction and one fsync for many records."""
        stopping = False
        try:
            while not stopping:
                batch = [await self._queue.get()]
                # Collect what arrives within the window; what is already queued never waits.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._window):
                        while len(batch) < self._max_batch and batch[-1] is not None:
                            batch.append(await self._queue.get())
                stopping = batch[-1] is None
                if pending := [item for item in batch if item is not None]:
                    await self._commit(pending)
        except asyncio.CancelledError:
            # Cancelled without close() (asyncio.run shutting down): stop the sqlite threads,
            # which would otherwise keep the process alive.
            self._closed = True
            await self._close_connections()
            raise

    async def _commit(self, batch: list[_Pending]) -> None:
        db = self._writer
        assert db is not None
        started = time.perf_counter()
        try:
            with self._errors("cannot write"):
                try:
                    ids = await self._write(db, batch, self._head)
                except sqlite3.IntegrityError:
                    if self._head is None:
                        raise
                    # Another connection appended since our last commit, so the first id was
                    # taken (ids are explicit and contiguous): chain onto its rows instead.
                    await db.execute("ROLLBACK")
                    ids = await self._write(db, batch, None)
        except Exception as exc:
            self._head = None
            with contextlib.suppress(Exception):
                await db.execute("ROLLBACK")
            error = exc if isinstance(exc, LedgerError) else LedgerError(str(exc))
            if isinstance(exc.__context__, sqlite3.OperationalError | OSError):
                self.write_failure = str(error)  # the file cannot take writes (disk full ...)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        self._commits += 1
        if self.on_commit is not None:
            self.on_commit(sum(1 for row_id in ids if row_id), time.perf_counter() - started)
        self.write_failure = None
        for row_id, pending in zip(ids, batch, strict=True):
            if not pending.future.done():
                pending.future.set_result(row_id)

    async def _write(
        self, db: aiosqlite.Connection, batch: list[_Pending], head: tuple[int, str] | None
    ) -> list[int]:
        """Append the batch in one transaction; return each item's row id (0: no row)."""
        # Every statement is a round trip to aiosqlite's thread, which costs more than the
        # statement itself: skip the ones with nothing to do.
        await db.execute("BEGIN IMMEDIATE")
        if head is None:
            # Read the head inside the write lock, so the chain stays linear.
            found = next(iter(await db.execute_fetchall(_HEAD)), (0, GENESIS_HASH))
            head = (int(found[0]), str(found[1]))
        last_id, prev = head
        rows, ids = [], []
        for pending in batch:
            if pending.values is None:
                ids.append(0)
                continue
            content = (last_id := last_id + 1, *pending.values)
            digest = _chain_hash(prev, content)
            rows.append((*content, prev, digest))
            ids.append(last_id)
            prev = digest
        if rows:
            await db.executemany(_INSERT, rows)
        if added := [p.outbox for p in batch if p.outbox is not None]:
            await db.executemany("INSERT OR REPLACE INTO outbox VALUES (?, ?, ?)", added)
        if removed := [(p.outbox_done,) for p in batch if p.outbox_done is not None]:
            await db.executemany("DELETE FROM outbox WHERE message_id = ?", removed)
        await db.execute("COMMIT")
        self._head = (last_id, prev)
        return ids

    async def _read(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        await self.init_db()
        assert self._reader is not None
        with self._errors("cannot read"):
            found = await self._reader.execute_fetchall(sql, tuple(params))
        return [_row_dict(row) for row in found]

    async def get_recent(self, limit: int = 10) -> list[dict[str, Any]]:
        """Return the newest rows first, as dicts."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise LedgerError(f"limit must be a non-negative integer, not {limit!r}")
        return await self._read(f"SELECT {_ALL} FROM logs ORDER BY id DESC LIMIT ?", (limit,))

    async def has_message(self, message_id: UUID, action: str = "received") -> bool:
        """Tell whether a message id was already recorded under an action (dedupe)."""
        sql = f"SELECT {_ALL} FROM logs WHERE message_id = ? AND action = ? LIMIT 1"
        return bool(await self._read(sql, (_id_text(message_id), action)))

    async def find(self, message_id: UUID) -> list[dict[str, Any]]:
        """Return every row about a message id, oldest first."""
        sql = f"SELECT {_ALL} FROM logs WHERE message_id = ? ORDER BY id"
        return await self._read(sql, (_id_text(message_id),))

    async def pending_commands(self) -> list[dict[str, Any]]:
        """Return received command_requests that were never started, finished nor answered."""
        return await self._read(_PENDING)

    async def interrupted_commands(self) -> list[dict[str, Any]]:
        """Return commands started or delegated but neither finished nor answered."""
        return await self._read(_INTERRUPTED)

    async def trace(self, message_id: UUID) -> list[dict[str, Any]]:
        """Rebuild the reply_to chain around a message: one row per message, in ledger order."""
        top, seen = _id_text(message_id), set()
        # Climb while the parent is in this ledger; a forged reply_to cycle stops too.
        while top not in seen:
            seen.add(top)
            parent = await self._read(_PARENT, (top,))
            if not parent:
                break
            top = parent[0]["message_id"]
        rows = await self._read(
            f"""WITH RECURSIVE chain(mid) AS (
                SELECT ? UNION
                SELECT l.message_id FROM logs AS l JOIN chain ON l.reply_to = chain.mid
                WHERE l.message_id IS NOT NULL)
            SELECT {_ALL} FROM logs WHERE message_id IN (SELECT mid FROM chain) ORDER BY id""",
            (top,),
        )
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["message_id"], []).append(row)
        chain = []
        for group in grouped.values():
            best = next((r for r in group if r["action"] in ("received", "sent")), group[0])
            chain.append({**best, "actions": [r["action"] for r in group]})
        return chain

    async def head(self) -> tuple[int, str]:
        """Return the newest row's id and hash ((0, the genesis hash) when empty)."""
        await self.init_db()
        assert self._reader is not None
        with self._errors("cannot read"):
            found = await self._reader.execute_fetchall(_HEAD)
        return next(((int(r[0]), str(r[1])) for r in found), (0, GENESIS_HASH))

    async def row_hashes(self, ids: Iterable[int]) -> dict[int, str]:
        """Return the stored hash of each of these rows that exists."""
        await self.init_db()
        assert self._reader is not None
        wanted = sorted(set(ids))
        found: dict[int, str] = {}
        with self._errors("cannot read"):
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                sql = f"SELECT id, hash FROM logs WHERE id IN ({marks})"
                found.update(
                    (int(r[0]), str(r[1])) for r in await self._reader.execute_fetchall(sql, chunk)
                )
        return found

    async def record_witness(self, child: UUID, head: tuple[int, str], *, final: bool) -> int:
        """Record a child's ledger head (row id, hash) as its status reported it.

        final: the child said it stopped, so nothing may follow this head.
        """
        details = {"row": head[0], "hash": head[1], "final": final}
        return await self.record(WITNESS_EVENT, WITNESS_ACTION, child, None, details)

    async def witnessed_heads(self, child: UUID | None = None) -> list[dict[str, Any]]:
        """Return the ledger heads this ledger witnessed, oldest first (of one child if named)."""
        sql = f"SELECT {_ALL} FROM logs WHERE event_type = ? AND action = ?"
        params: list[Any] = [WITNESS_EVENT, WITNESS_ACTION]
        if child is not None:
            sql += " AND source = ?"
            params.append(_id_text(child))
        return await self._read(sql + " ORDER BY id", params)

    async def verify(self) -> VerifyReport:
        """Recompute the hash chain and report the first row that does not match."""
        await self.init_db()
        assert self._reader is not None
        rows, bad, problem, prev = 0, None, None, GENESIS_HASH
        with self._errors("cannot verify"):
            async with self._reader.execute(f"SELECT {_ALL} FROM logs ORDER BY id") as cursor:
                async for row in cursor:
                    rows += 1
                    if bad is not None:
                        continue
                    content, row_id = tuple(row[:-2]), row[0]
                    if row_id != rows:
                        problem = f"row {row_id} follows row {rows - 1}: rows are missing"
                    elif row[-2] != prev:
                        problem = f"row {row_id} does not chain to row {rows - 1} before it"
                    elif _chain_hash(prev, content) != row[-1]:
                        problem = f"row {row_id} does not match its hash: it was edited"
                    bad = None if problem is None else row_id
                    prev = row[-1]
            triggers = await self._reader.execute_fetchall(_TRIGGERS_FOUND)
        if problem is None:
            problem = _trigger_problem(triggers)
        return VerifyReport(ok=problem is None, rows=rows, first_bad_row=bad, problem=problem)

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Turn sqlite's errors into LedgerError naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            if APPEND_ONLY in str(exc):
                raise LedgerError(f"ledger {self.path} is append-only: {exc}") from None
            raise LedgerError(f"ledger {self.path}: {doing}: {exc}") from None
