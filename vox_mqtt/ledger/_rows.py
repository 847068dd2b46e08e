"""How a record becomes a ledger row: checked, laid out, never the free text of a message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from vox_mqtt.ledger._index import emitted_epoch
from vox_mqtt.ledger._schema import _KEPT_DETAILS, _MAX_REASON, _canonical, _id_text, _scrub
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import VOXMessage, now_iso
from vox_mqtt.protocol.signing import SignedTopic

__all__ = ["Received", "Values", "make_row", "message_row"]

Values = tuple[Any, ...]  # a row's _COLUMNS without id
Received = tuple[str, float]  # a "received" row's message_id and emission time


def message_row(
    message: VOXMessage,
    source: str,
    action: LedgerAction,
    outcome: str | None,
    reason: str | None,
    topic: str | None,
) -> tuple[Values, Received | None]:
    """Lay out a message's row: its metadata, never its free text (docs/ledger.md)."""
    details: dict[str, Any] = {"message_source": source}  # as the ledger stores it
    for key in _KEPT_DETAILS.get(message.type, ()):
        if key in message.details:
            details[key] = message.details[key]
    if topic is not None:
        details["topic"] = str(topic)
        if isinstance(topic, SignedTopic):  # what proves who sent it (docs/ledger.md)
            details["signature"] = topic.signature
            details["payload_sha256"] = topic.digest
    meta = {
        "message_id": _id_text(message.message_id),
        "message_type": message.type,
        "reply_to": _id_text(message.reply_to),
        "emitted_at": message.emitted_at,
        "outcome": outcome,
        "reason": reason,
    }
    return make_row("message", action, message.source, message.target, _details_text(details), meta)


def _details_text(details: dict[str, Any]) -> dict[str, Any] | str:
    """Serialize details that hold nothing to scrub; otherwise leave them to _scrub."""
    # Parsed messages hold plain JSON: if the serialized text never names note_to_human,
    # no key at any depth does, and _scrub would change nothing the text shows.
    try:
        text = _canonical(details)
    except (TypeError, ValueError):
        text = '"note_to_human"'  # a UUID or another value only _scrub makes plain
    if '"note_to_human"' in text:
        clean: dict[str, Any] = _scrub(details)
        return clean
    return text


def make_row(
    event_type: str,
    action: str,
    source: UUID | str | None,
    target: UUID | str | None,
    details: dict[str, Any] | str,
    meta: Mapping[str, str | None],
) -> tuple[Values, Received | None]:
    """Check and lay out one row (details clean, or already their canonical text).

    A bad row fails here, alone, never inside a batch.
    """
    for name, word in (("event_type", event_type), ("action", action)):
        if not isinstance(word, str) or not 0 < len(word) <= 64:
            raise LedgerError(f"{name} must be a string of 1 to 64 characters, not {word!r}")
    reason = meta.get("reason")
    try:
        text = details if isinstance(details, str) else _canonical(details)
        # In _COLUMNS order, after id.
        values = (
            *(now_iso(), event_type, action, _id_text(source), _id_text(target)),
            *(meta.get("message_id"), meta.get("message_type"), meta.get("reply_to")),
            *(meta.get("emitted_at"), meta.get("outcome")),
            *(None if reason is None else reason[:_MAX_REASON], text),
        )
        # A field that is not UTF-8 would fail inside the batch and take its neighbours down.
        "".join(v for v in values if isinstance(v, str)).encode()
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"cannot record {action!r}: {exc}") from None
    received = None
    if action == LedgerAction.RECEIVED and (message_id := values[5]) is not None:
        received = (message_id, emitted_epoch(values[8]))
    return values, received
