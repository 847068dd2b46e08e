"""The one place where sqlite's errors become the ledger's own (LedgerError, naming the file)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from vox_mqtt.ledger._schema import APPEND_ONLY
from vox_mqtt.protocol.errors import LedgerError

__all__ = ["ledger_error", "sqlite_errors"]


@contextlib.contextmanager
def sqlite_errors(path: Path, doing: str) -> Iterator[None]:
    """Turn sqlite's errors into LedgerError naming the file and what was being done."""
    try:
        yield
    except sqlite3.Error as exc:
        raise ledger_error(path, exc, doing) from None


def ledger_error(path: Path, exc: BaseException, doing: str) -> LedgerError:
    """Return the LedgerError that says what an error means for the ledger at path."""
    if isinstance(exc, LedgerError):
        return exc
    if APPEND_ONLY in str(exc):
        return LedgerError(f"ledger {path} is append-only: {exc}")
    return LedgerError(f"ledger {path}: {doing}: {exc}")
