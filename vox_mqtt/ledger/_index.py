"""The ledger's dedupe index: ids of messages received, by emission time, kept in memory."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Final

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.messages import parse_timestamp

__all__ = ["ReceivedIndex", "emitted_epoch"]

# The index holds the ids of messages received that were emitted within this horizon, and
# at most this many of them (docs/ledger.md, "The dedupe index").
HORIZON: Final = 600.0
MAX_IDS: Final = 200_000
_RECEIVED_SINCE: Final = f"""SELECT message_id, emitted_at FROM logs
    WHERE action = '{LedgerAction.RECEIVED}' AND message_id IS NOT NULL
      AND (julianday(emitted_at) IS NULL OR julianday(emitted_at) >= ?)"""


def emitted_epoch(emitted_at: str | None) -> float:
    """Return a message's emission time in seconds; +inf when it has none that parses."""
    try:
        return math.inf if emitted_at is None else parse_timestamp(emitted_at).timestamp()
    except ValueError:
        return math.inf


class ReceivedIndex:
    """Every id recorded "received" whose emission time is after `floor`.

    Every copy of a message carries the same emitted_at, so for a message emitted after the
    floor the index alone tells whether it was received; for an older one it cannot.
    """

    def __init__(self) -> None:
        self.floor = time.time() - HORIZON
        self._ids: dict[str, float] = {}  # message_id -> emission time
        self._added = 0

    def load(self, db: sqlite3.Connection) -> list[tuple[str, float]]:
        """Read the ids the index must hold from the ledger (on the writer's thread)."""
        # A day of margin: SQLite and Python may read an odd timestamp differently.
        since = self.floor / 86400.0 + 2440587.5 - 1.0
        rows = db.execute(_RECEIVED_SINCE, (since,)).fetchall()
        return [(str(message_id), emitted_epoch(emitted_at)) for message_id, emitted_at in rows]

    def knows(self, emitted_at: str) -> bool:
        """Tell whether the index can answer for a message emitted then."""
        return emitted_epoch(emitted_at) > self.floor

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._ids

    def add(self, message_id: str, emitted: float) -> None:
        """Add a committed "received" row, pruning the index now and then."""
        if emitted <= self.floor:
            return
        self._ids[message_id] = emitted
        self._added += 1
        if self._added % 4096 == 0 or len(self._ids) > MAX_IDS:
            floor = time.time() - HORIZON
            if len(self._ids) > MAX_IDS:  # a flood of ids: keep the newest half
                floor = max(floor, sorted(self._ids.values())[len(self._ids) // 2])
            if floor > self.floor:
                self.floor = floor
                self._ids = {m: e for m, e in self._ids.items() if e > floor}
