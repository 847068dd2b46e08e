"""The ledger's schema, SQL and pure helpers (hash chain, canonical JSON, scrubbing)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.ledger.actions import DONE_ACTIONS, STARTED_ACTIONS, LedgerAction, sql_list
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST

SCHEMA_VERSION: Final = "1"
GENESIS_HASH: Final = "0" * 64
APPEND_ONLY: Final = "ledger is append-only"
# A master's record of a child's ledger head, as the child's heartbeat reported it.
WITNESS_EVENT: Final = "witness"
WITNESS_ACTION: Final = LedgerAction.LEDGER_HEAD
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
_REFUSE: Final = f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END;"
# Every trigger the ledger must have, by name, as its complete SQL: verify() compares the
# text, so a trigger emptied or weakened under the expected name is caught too.
_TRIGGER_SQL: Final = {
    "logs_no_update": f"CREATE TRIGGER logs_no_update BEFORE UPDATE ON logs {_REFUSE}",
    "logs_no_delete": f"CREATE TRIGGER logs_no_delete BEFORE DELETE ON logs {_REFUSE}",
    # INSERT OR REPLACE deletes the row it collides with without firing DELETE triggers, so
    # an insert must name the id after the head and chain onto the head's hash. The check
    # runs before the conflict is resolved, while the old row is still there.
    "logs_append_at_head": f"""CREATE TRIGGER logs_append_at_head BEFORE INSERT ON logs
    WHEN NEW.id IS NOT (SELECT COALESCE(MAX(id), 0) + 1 FROM logs)
      OR NEW.prev_hash IS NOT COALESCE((SELECT hash FROM logs WHERE id = NEW.id - 1),
                                       '{GENESIS_HASH}')
    {_REFUSE}""",
    "meta_no_update": f"CREATE TRIGGER meta_no_update BEFORE UPDATE ON ledger_meta {_REFUSE}",
    "meta_no_delete": f"CREATE TRIGGER meta_no_delete BEFORE DELETE ON ledger_meta {_REFUSE}",
    "meta_no_replace": f"""CREATE TRIGGER meta_no_replace BEFORE INSERT ON ledger_meta
    WHEN EXISTS (SELECT 1 FROM ledger_meta WHERE key = NEW.key) {_REFUSE}""",
}
_TRIGGERS: Final = tuple(_TRIGGER_SQL)
# Creates what an older file lacks; a trigger that exists under its name is left for
# verify() to judge, never silently replaced.
_ENSURE_TRIGGERS: Final = "".join(
    sql.replace("CREATE TRIGGER", "CREATE TRIGGER IF NOT EXISTS", 1) + "\n"
    for sql in _TRIGGER_SQL.values()
)
# A received command's origin message_source, sealed, until it starts or ends (docs/ledger.md).
_HELD: Final = """CREATE TABLE IF NOT EXISTS held (message_id TEXT PRIMARY KEY,
    source TEXT NOT NULL);"""
# An answer to a received command_request, whole (sealed as the outbox keeps it), held until
# its request's deadline: a re-sent request is answered with it again, never run again
# (docs/ledger.md, "Answers held for replay"). Mutable like the outbox; the rows stay.
_REPLAY: Final = """CREATE TABLE IF NOT EXISTS replay (request_id TEXT PRIMARY KEY,
    topic TEXT NOT NULL, payload BLOB NOT NULL, keep_until REAL NOT NULL);
CREATE INDEX IF NOT EXISTS replay_until ON replay (keep_until);"""
_HELD_ANSWER: Final = "SELECT payload, keep_until FROM replay WHERE request_id = ?"
# A ledger from before: an answer to a received command waiting in its outbox, to be
# re-sent until acknowledged, is held for replay instead (until its request's deadline, or
# an hour from now for a request without one, plus a minute), as it is never acknowledged
# any more (docs/ledger.md, "Answers held for replay").
_LEGACY_ANSWERS: Final = f"""SELECT o.message_id, a.reply_to, o.topic, o.payload,
    COALESCE((julianday(json_extract(r.details, '$.deadline')) - 2440587.5) * 86400.0,
             ? + 3600.0) + 60.0
    FROM outbox AS o JOIN logs AS a ON a.message_id = o.message_id
      AND a.action = '{LedgerAction.SENT}'
    JOIN logs AS r ON r.message_id = a.reply_to AND r.action = '{LedgerAction.RECEIVED}'
    WHERE a.message_type IN ('command_result', 'command_error')
      AND r.message_type = 'command_request'"""
_MARK_TRIGGERS: Final = "INSERT INTO ledger_meta (key, value) VALUES ('triggers', '2');\n"
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
{_HELD}
{_REPLAY}
CREATE INDEX IF NOT EXISTS logs_message ON logs (message_id, action);
CREATE INDEX IF NOT EXISTS logs_reply_to ON logs (reply_to);
CREATE INDEX IF NOT EXISTS logs_action ON logs (action, message_type);
INSERT OR IGNORE INTO ledger_meta (key, value) VALUES ('schema', '{SCHEMA_VERSION}');
{_MARK_TRIGGERS}{_ENSURE_TRIGGERS}COMMIT;
"""
_TRIGGERS_VERSION: Final = "SELECT value FROM ledger_meta WHERE key = 'triggers'"
_UPGRADE: Final = f"BEGIN IMMEDIATE;\n{_ENSURE_TRIGGERS}{_MARK_TRIGGERS}COMMIT;\n"
_TRIGGERS_FOUND: Final = (
    "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
)


def _same_sql(found: str | None, expected: str) -> bool:
    """Compare two statements ignoring layout (sqlite keeps the text as it was written)."""

    def norm(sql: str) -> str:
        return " ".join(sql.split()).rstrip(";")

    return found is not None and norm(found) == norm(expected)


def _trigger_problem(found: Iterable[Sequence[Any]]) -> str | None:
    """Name what is wrong with the (name, table, sql) triggers found, or None if ours."""
    seen: dict[str, str | None] = {str(row[0]): row[2] for row in found}
    missing = [name for name in _TRIGGER_SQL if name not in seen]
    if missing:
        return f"append-only triggers are missing: {', '.join(missing)}"
    changed = [n for n, sql in _TRIGGER_SQL.items() if not _same_sql(seen[n], sql)]
    if changed:
        return f"append-only triggers were changed: {', '.join(changed)}"
    extra = sorted(set(seen) - set(_TRIGGER_SQL))
    if extra:
        return f"unexpected triggers on the ledger: {', '.join(extra)}"
    return None


def _unfinished(starts: tuple[LedgerAction, ...], ends: tuple[LedgerAction, ...]) -> str:
    """Select the first command_request row per message in `starts` with no later end."""
    began, ended = sql_list(starts), sql_list(ends)
    return f"""SELECT {_ALL} FROM logs AS r
    WHERE r.action IN ({began}) AND r.message_type = '{MSG_COMMAND_REQUEST}'
      AND r.id = (SELECT MIN(y.id) FROM logs AS y
                  WHERE y.message_id = r.message_id AND y.action IN ({began}))
      AND NOT EXISTS (SELECT 1 FROM logs AS x WHERE x.message_id = r.message_id
                      AND x.id > r.id AND x.action IN ({ended}))
      AND NOT EXISTS (SELECT 1 FROM logs AS a WHERE a.reply_to = r.message_id
                      AND a.id > r.id AND a.action = '{LedgerAction.SENT}'
                      AND a.message_type IN ('command_result', 'command_error'))
    ORDER BY r.id"""


_PENDING: Final = _unfinished((LedgerAction.RECEIVED,), (*STARTED_ACTIONS, *DONE_ACTIONS))
_INTERRUPTED: Final = _unfinished(STARTED_ACTIONS, DONE_ACTIONS)
# The requests sent down for a command (their reply_to), oldest first.
_DOWNSTREAM: Final = f"""SELECT {_ALL} FROM logs WHERE reply_to = ?
    AND action = '{LedgerAction.SENT}'
    AND message_type = '{MSG_COMMAND_REQUEST}' ORDER BY id"""

# The payload keys worth keeping per type: identifiers and codes, never free text.
_KEPT_DETAILS: Final[dict[str, tuple[str, ...]]] = {
    "command_request": ("command", "params", "deadline"),
    "command_result": ("command", "handled_by"),
    "command_error": ("code", "command", "handled_by"),
    "message_acknowledged": ("in_response_to",),
    "system_failure": ("error_code", "severity", "subject", "epoch", "resolved"),
    "data_request": ("subject",),
    "data_response": ("request_id",),
    "decision": ("in_response_to", "verdict"),
    "decision_recorded": ("in_response_to", "verdict", "outcome"),
    # A request's life (docs/ledger.md): the request each names, never a reason or a note.
    "cancel_request": ("request_id",),
    "cancel_report": ("request_id", "state"),
    "status_query": ("request_id",),
    "status_report": ("request_id", "state"),
    "command_progress": ("state", "fraction", "seq"),
}


def _chain_hash(prev_hash: str, content: Iterable[Any]) -> str:
    """Hash a row's content columns, as canonical JSON, onto the previous row's hash."""
    canonical = _canonical(dict(zip(_COLUMNS, content, strict=True)))
    return hashlib.sha256((prev_hash + canonical).encode("utf-8")).hexdigest()


# One encoder for every row: json.dumps builds a new one per call when given options.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


# The C encoder _ENCODER.encode builds afresh for every call, built once: without the
# circular-reference check (rows and their details are trees of JSON values), which is what
# makes it reusable, and from any thread. Same text, byte for byte.
_ROW_ENCODER: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, False
    )
)


def _canonical(data: Any) -> str:
    """Serialize as canonical JSON: sorted keys, no spaces, no NaN."""
    if _ROW_ENCODER is None:
        return _ENCODER.encode(data)
    return "".join(_ROW_ENCODER(data, 0))


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


def _load_key(path: Path) -> bytes:
    """Read the ledger's digest key, creating it (owner-only) on first use."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < 16:
            raise ValueError(f"{path} holds {len(key)} bytes, not a digest key") from None
        return key
    key = secrets.token_bytes(32)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _source_digest(key: bytes, source: str) -> str:
    """Return the keyed digest a ledger keeps instead of a message_source in clear."""
    mac = hmac.new(key, source.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return "hmac:" + mac.hexdigest()[:32]


def _outbox_payload(payload: bytes, source: str, stored_source: str) -> bytes:
    """Return a sent message as the outbox may keep it: no note_to_human, the source sealed.

    A restart re-sends this form; until then the agent re-sends the whole message from
    memory (docs/ledger.md, "The outbox").
    """
    if b'"note_to_human"' not in payload:
        if source == stored_source:
            return payload
        # The envelope's field comes before details, so the first match is the envelope's.
        was = b'"message_source":' + json.dumps(source, ensure_ascii=False).encode()
        if was in payload:
            now = b'"message_source":' + json.dumps(stored_source).encode()
            return payload.replace(was, now, 1)
    data = json.loads(payload)
    data["message_source"] = stored_source
    data["details"] = _scrub(data.get("details", {}))
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
