"""How a record becomes a ledger row: checked, laid out, never the free text of a message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from ._ledgerindex import emitted_epoch
from ._ledgerschema import _COLUMNS, _KEPT_DETAILS, _MAX_REASON, _canonical, _id_text, _scrub
from .errors import LedgerError
from .messages import VOXMessage, now_iso

__all__ = ["Received", "Values", "make_row", "message_row"]

Values = tuple[Any, ...]  # a row's _COLUMNS without id
Received = tuple[str, float]  # a "received" row's message_id and emission time


def message_row(
    message: VOXMessage,
    action: str,
    outcome: str | None,
    reason: str | None,
    topic: str | None,
) -> tuple[Values, Received | None]:
    """Lay out a message's row: its metadata, never its free text (docs/ledger.md)."""
    details: dict[str, Any] = {"message_source": message.message_source[:200]}
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
    return make_row("message", action, message.source, message.target, _scrub(details), meta)


def make_row(
    event_type: str,
    action: str,
    source: UUID | str | None,
    target: UUID | str | None,
    details: dict[str, Any],
    meta: Mapping[str, str | None],
) -> tuple[Values, Received | None]:
    """Check and lay out one row; a bad one fails here, alone, never inside a batch."""
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
    received = None
    if action == "received" and (message_id := row.get("message_id")) is not None:
        received = (message_id, emitted_epoch(row.get("emitted_at")))
    return values, received
