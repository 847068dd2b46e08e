"""The ledger's longer queries: the reply_to chain around a message, and the chain's check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiosqlite

from vox_mqtt.ledger._schema import (
    _ALL,
    _PARENT,
    _TRIGGERS_FOUND,
    GENESIS_HASH,
    WITNESS_ACTION,
    WITNESS_EVENT,
    _chain_hash,
    _id_text,
    _trigger_problem,
)
from vox_mqtt.ledger.actions import LedgerAction

__all__ = ["VerifyReport", "row_hashes", "trace_chain", "verify_chain", "witnessed_query"]

Read = Callable[[str, Iterable[Any]], Awaitable[list[dict[str, Any]]]]
# The row a trace shows for a message: the one that received or sent it, if any.
_CHAINED = (LedgerAction.RECEIVED, LedgerAction.SENT)


async def trace_chain(read: Read, message_id: UUID) -> list[dict[str, Any]]:
    """Climb to the first ancestor in this ledger, then take every descendant, one row each."""
    top, seen = _id_text(message_id), set()
    # Climb while the parent is in this ledger; a forged reply_to cycle stops too.
    while top not in seen:
        seen.add(top)
        parent = await read(_PARENT, (top,))
        if not parent:
            break
        top = parent[0]["message_id"]
    rows = await read(
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
        best = next((r for r in group if r["action"] in _CHAINED), group[0])
        chain.append({**best, "actions": [r["action"] for r in group]})
    return chain


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of checking the hash chain and the append-only triggers."""

    ok: bool
    rows: int
    first_bad_row: int | None
    problem: str | None


async def verify_chain(reader: aiosqlite.Connection) -> VerifyReport:
    """Recompute the hash chain and report the first row that does not match."""
    rows, bad, problem, prev = 0, None, None, GENESIS_HASH
    async with reader.execute(f"SELECT {_ALL} FROM logs ORDER BY id") as cursor:
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
    triggers = await reader.execute_fetchall(_TRIGGERS_FOUND)
    if problem is None:
        problem = _trigger_problem(triggers)
    return VerifyReport(ok=problem is None, rows=rows, first_bad_row=bad, problem=problem)


async def row_hashes(reader: aiosqlite.Connection, ids: Iterable[int]) -> dict[int, str]:
    """Return the stored hash of each of these rows that exists, 500 ids per query."""
    wanted = sorted(set(ids))
    found: dict[int, str] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        sql = f"SELECT id, hash FROM logs WHERE id IN ({marks})"
        found.update((int(r[0]), str(r[1])) for r in await reader.execute_fetchall(sql, chunk))
    return found


def witnessed_query(child: str | None) -> tuple[str, list[Any]]:
    """The query of the ledger heads witnessed, oldest first (of one child if named)."""
    sql = f"SELECT {_ALL} FROM logs WHERE event_type = ? AND action = ?"
    params: list[Any] = [WITNESS_EVENT, WITNESS_ACTION]
    if child is not None:
        sql += " AND source = ?"
        params.append(child)
    return sql + " ORDER BY id", params
