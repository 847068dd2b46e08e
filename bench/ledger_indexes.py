"""What each of the ledger's secondary indexes and its append trigger cost per row.

    .venv/bin/python -m bench.ledger_indexes

An experiment, not a figure: the ledger's schema (ledger/_schema.py) in a fresh file,
rows inserted as the writer thread inserts them (ledger/_writer._insert, six chained rows
and an outbox entry added and one removed per transaction, secure_delete on, WAL,
synchronous NORMAL so that the fsync is left out), and the thread's CPU per row measured
with the whole schema, then with one index or the append trigger dropped. Each variant
is the best of three runs. What it showed on 7 December is in docs/performance.md ("The
floor, part by part").
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

from vox_mqtt.ledger._schema import _COLUMNS, _SCHEMA, GENESIS_HASH
from vox_mqtt.ledger._writer import _insert

ACTIONS = ("received", "started", "sent", "completed", "delegated", "acknowledged")
DETAILS = json.dumps(
    {"command": "analyze", "params": {"target": "x" * 40}, "deadline": "2026-12-07T00:00:00Z"}
)
VARIANTS = {
    "the whole schema": [],
    "without logs_action (action, message_type)": ["DROP INDEX logs_action"],
    "without logs_reply_to": ["DROP INDEX logs_reply_to"],
    "without the append trigger": ["DROP TRIGGER logs_append_at_head"],
    "without those two indexes and the trigger": [
        "DROP INDEX logs_action",
        "DROP INDEX logs_reply_to",
        "DROP TRIGGER logs_append_at_head",
    ],
}


def microseconds_per_row(drop: list[str], batches: int = 1500) -> float:
    """Insert `batches` transactions of six chained rows; return the thread's CPU per row."""
    with tempfile.TemporaryDirectory(prefix="vox-bench-indexes-") as tmp:
        db = sqlite3.connect(Path(tmp) / "ledger.db", isolation_level=None)
        db.executescript(_SCHEMA)
        for statement in drop:
            db.execute(statement)
        for pragma in ("secure_delete = ON", "journal_mode = WAL", "synchronous = NORMAL"):
            db.execute(f"PRAGMA {pragma}")
        last, prev, before = 0, GENESIS_HASH, None
        started = time.thread_time()
        for _ in range(batches):
            message_id, rows = str(uuid.uuid4()), []
            for i, action in enumerate(ACTIONS):
                last += 1
                values = {
                    "id": last,
                    "recorded_at": "2026-12-07T17:00:00.000+00:00",
                    "event_type": "message",
                    "action": action,
                    "source": str(uuid.uuid4()),
                    "target": str(uuid.uuid4()),
                    "message_id": message_id,
                    "message_type": "command_request",
                    "reply_to": str(uuid.uuid4()) if i % 2 else None,
                    "emitted_at": "2026-12-07T17:00:00.000+00:00",
                    "details": DETAILS,
                }
                content = tuple(values.get(column) for column in _COLUMNS)
                digest = hashlib.sha256((prev + json.dumps(content)).encode()).hexdigest()
                rows.append((*content, prev, digest))
                prev = digest
            db.execute("BEGIN IMMEDIATE")
            _insert(db, rows)
            db.execute("INSERT INTO outbox VALUES (?, ?, ?)", (message_id, "t", b"x" * 600))
            if before is not None:
                db.execute("DELETE FROM outbox WHERE message_id = ?", (before,))
            db.execute("COMMIT")
            before = message_id
        spent = time.thread_time() - started
        db.close()
    return spent / (batches * len(ACTIONS)) * 1e6


def main() -> int:
    """Print each variant's CPU per row."""
    for name, drop in VARIANTS.items():
        best = min(microseconds_per_row(drop) for _ in range(3))
        print(f"{name:<44} {best:6.1f} us of CPU per row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
