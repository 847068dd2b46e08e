"""The ledger's schema, SQL and pure helpers (hash chain, canonical JSON, scrubbing)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final
from uuid import UUID

from .messages import MSG_COMMAND_REQUEST

SCHEMA_VERSION: Final = "1"
GENESIS_HASH: Final = "0" * 64
APPEND_ONLY: Final = "ledger is append-only"
# A command runs once started or delegated; it is over once completed, failed or answered.
STARTED_ACTIONS: Final = ("started", "delegated")
DONE_ACTIONS: Final = ("completed", "failed")
# Free text for the human only: seed 003 forbids agents to parse or log it.
_STRIPPED_KEYS: Final = frozenset({"note_to_human"})
_MAX_REASON: Final = 1000
# Keys of a seed-003 details dict that also fill an indexed column: key -> column.
_PROMOTED: Final = {"type": "message_type"} | {
    k: k for k in ("message_id", "reply_to", "emitted_at")
}

# The hashed content of a row, in storage order; prev_hash and hash follow.
_COLUMNS: Final = (
    *("id", "recorded_at", "event_type", "action", "source", "target", "message_id"),
    *("message_type", "reply_to", "emitted_at", "outcome", "reason", "details"),
)
_ALL: Final = ", ".join((*_COLUMNS, "prev_hash", "hash"))
_PARENT: Final = f"""SELECT {_ALL} FROM logs WHERE message_id = (SELECT reply_to FROM logs
    WHERE message_id = ? AND reply_to IS NOT NULL ORDER BY id LIMIT 1) ORDER BY id LIMIT 1"""
_HEAD: Final = "SELECT id, hash FROM logs ORDER BY id DESC LIMIT 1"
_TRIGGERS: Final = ("logs_no_update", "logs_no_delete", "meta_no_update", "meta_no_delete")
_REFUSE: Final = f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END;"
_SCHEMA: Final = f"""
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS logs (
    id INTEGER PRIMARY KEY, recorded_at TEXT NOT NULL, event_type TEXT NOT NULL,
    action TEXT NOT NULL, source TEXT, target TEXT, message_id TEXT, message_type TEXT,
    reply_to TEXT, emitted_at TEXT, outcome TEXT, reason TEXT, details TEXT NOT NULL,
    prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (message_id TEXT PRIMARY KEY, topic TEXT NOT NULL,
    payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS logs_message ON logs (message_id, action);
CREATE INDEX IF NOT EXISTS logs_reply_to ON logs (reply_to);
CREATE INDEX IF NOT EXISTS logs_action ON logs (action, message_type);
INSERT OR IGNORE INTO ledger_meta (key, value) VALUES ('schema', '{SCHEMA_VERSION}');
CREATE TRIGGER IF NOT EXISTS logs_no_update BEFORE UPDATE ON logs {_REFUSE}
CREATE TRIGGER IF NOT EXISTS logs_no_delete BEFORE DELETE ON logs {_REFUSE}
CREATE TRIGGER IF NOT EXISTS meta_no_update BEFORE UPDATE ON ledger_meta {_REFUSE}
CREATE TRIGGER IF NOT EXISTS meta_no_delete BEFORE DELETE ON ledger_meta {_REFUSE}
COMMIT;
"""


def _unfinished(starts: tuple[str, ...], ends: tuple[str, ...]) -> str:
    """Select the first command_request row per message in `starts` with no later end."""
    began, ended = (", ".join(f"'{action}'" for action in group) for group in (starts, ends))
    return f"""SELECT {_ALL} FROM logs AS r
    WHERE r.action IN ({began}) AND r.message_type = '{MSG_COMMAND_REQUEST}'
      AND r.id = (SELECT MIN(y.id) FROM logs AS y
                  WHERE y.message_id = r.message_id AND y.action IN ({began}))
      AND NOT EXISTS (SELECT 1 FROM logs AS x WHERE x.message_id = r.message_id
                      AND x.id > r.id AND x.action IN ({ended}))
      AND NOT EXISTS (SELECT 1 FROM logs AS a WHERE a.reply_to = r.message_id
                      AND a.id > r.id AND a.action = 'sent'
                      AND a.message_type IN ('command_result', 'command_error'))
    ORDER BY r.id"""


_PENDING: Final = _unfinished(("received",), (*STARTED_ACTIONS, *DONE_ACTIONS))
_INTERRUPTED: Final = _unfinished(STARTED_ACTIONS, DONE_ACTIONS)

# The payload keys worth keeping per type: identifiers and codes, never free text.
_KEPT_DETAILS: Final[dict[str, tuple[str, ...]]] = {
    "command_request": ("command", "params", "deadline"),
    "command_result": ("command", "handled_by"),
    "command_error": ("code", "command", "handled_by"),
    "message_acknowledged": ("in_response_to",),
    "system_failure": ("error_code", "severity", "subject", "epoch", "resolved"),
    "data_request": ("subject",),
    "data_response": ("request_id",),
}


def _chain_hash(prev_hash: str, content: Iterable[Any]) -> str:
    """Hash a row's content columns, as canonical JSON, onto the previous row's hash."""
    canonical = _canonical(dict(zip(_COLUMNS, content, strict=True)))
    return hashlib.sha256((prev_hash + canonical).encode("utf-8")).hexdigest()


# One encoder for every row: json.dumps builds a new one per call when given options.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _canonical(data: Any) -> str:
    """Serialize as canonical JSON: sorted keys, no spaces, no NaN."""
    return _ENCODER.encode(data)


# A UUID's text, for the few peers and the recent messages every row names again.
_ID_TEXTS: dict[UUID, str] = {}


def _id_text(value: UUID | str | None) -> str | None:
    """Write ids in one canonical form, so lookups match however the caller spelled them."""
    if value is None:
        return None
    if isinstance(value, UUID):  # a UUID's own str is already canonical
        text = _ID_TEXTS.get(value)
        if text is None:
            if len(_ID_TEXTS) >= 4096:
                _ID_TEXTS.clear()
            text = _ID_TEXTS[value] = str(value)
        return text
    try:
        return str(UUID(str(value)))
    except ValueError:
        return str(value)


def _scrub(value: Any) -> Any:
    """Drop note_to_human at any depth and make the rest plain JSON data."""
    if isinstance(value, Mapping):
        return {str(k): _scrub(v) for k, v in value.items() if k not in _STRIPPED_KEYS}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    return value


def _row_dict(row: Iterable[Any]) -> dict[str, Any]:
    data = dict(zip((*_COLUMNS, "prev_hash", "hash"), row, strict=True))
    data["details"] = json.loads(data["details"])
    return data
