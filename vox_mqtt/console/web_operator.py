"""The web console's operator pages (docs/web.md): the root's inbox and the requests sent.

Both come from the operator's own state dir, never from the broker: the inbox from the
notifications file the operator's session keeps (`inbox.jsonl`, as `vox inbox` reads it,
with `inbox.read` marking the last one read), the requests from the operator's ledger
(`logs.db`), opened read-only (`VOXAgentMemory(read_only=True)`: a query-only connection
that never writes a row). The pure functions turn what is read into JSON-ready rows; the
browser puts every string of them in the page as text. `OperatorPages` reads the files and
says when they changed, so the page can follow them live.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.console.decisions import OVERLAPS, Job, number_jobs, verdict_word
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
)
from vox_mqtt.protocol.signing import SealKey, is_sealed, open_sealed

__all__ = [
    "INBOX_SHOWN",
    "LEDGER_ROWS",
    "NOTE_WITHHELD",
    "REQUESTS_SHOWN",
    "OperatorPages",
    "inbox_rows",
    "job_row",
    "note_of",
    "parse_inbox",
    "request_rows",
    "timeline_rows",
]

# What the inbox says instead of a note to a request that did not prove the operator.
NOTE_WITHHELD: Final = (
    "sealed: start vox web with a token (--token-file or --generate-token) to read it here "
    "(docs/security.md, F28)"
)
INBOX_SHOWN: Final = 200  # the newest notifications listed
INBOX_TAIL: Final = 4 * 1024 * 1024  # bytes of inbox.jsonl read from its end
LEDGER_ROWS: Final = 5000  # the newest ledger rows the requests list is built from
REQUESTS_SHOWN: Final = 100
TIMELINE_MAX: Final = 200
# A request this side sent ends with one of these rows of its own (docs/ledger.md).
_ENDS: Final = {LedgerAction.EXPIRED: "EXPIRED", LedgerAction.FAILED: "FAILED"}
_IN_FLIGHT: Final = frozenset({"SENT", "ACKNOWLEDGED", "PROGRESS"})


def parse_inbox(text: str) -> list[dict[str, Any]]:
    """Return the notifications of an inbox.jsonl text, oldest first (torn lines skipped)."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a torn last line after a crash, or the first one cut by the tail read
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def note_of(note: Any, seal_key: SealKey | None) -> tuple[str | None, str | None]:
    """Return a note_to_human as the person may read it, and why it is sealed (or None).

    A sealed note opens with the operator's key, as `vox inbox` opens it; without the key
    (or one it does not open with) the row says it is sealed, and never shows ciphertext
    (docs/security.md, sealed notes).
    """
    if note is None:
        return None, None
    if not is_sealed(note):
        return str(note), None
    if seal_key is None:
        return None, "sealed for the operator: this console has no operator key to open it"
    try:
        return open_sealed(str(note), seal_key), None
    except ValueError:
        return None, "sealed for the operator: it does not open with this console's key"


def inbox_rows(
    entries: list[dict[str, Any]],
    last_read: str | None,
    names: Mapping[str, str],
    seal_key: SealKey | None = None,
    *,
    proven: bool = False,
    decisions: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Return the newest notifications first, as rows, and how many are unread.

    A row keeps the job's note_to_human apart (`note`, opened with seal_key when sealed;
    `sealed` says why not when it cannot be), for the person only; the rest of the details
    is shown as JSON text. Unless the request proved the operator (proven: it carried the
    console's token), no note is in a row, sealed or not: `sealed` says how to read it
    (docs/security.md, F28). `last_read` is the message id `vox inbox` marked read last: the
    ones after it are new (all of them when the mark is not found). A job notification
    also carries its number, its decision or the undecided jobs it overlaps (`job_row`),
    numbered as `vox inbox` numbers them from the decisions the console recorded.
    """
    jobs = {j.message_id: j for j in number_jobs(entries, decisions or [])}
    every = sorted(jobs.values(), key=lambda j: j.number)
    unread_from = 0
    if last_read is not None:
        for index in range(len(entries) - 1, -1, -1):
            if entries[index].get("message_id") == last_read:
                unread_from = index + 1
                break
    rows = []
    for index, entry in enumerate(entries):
        raw = entry.get("details")
        details = dict(raw) if isinstance(raw, dict) else {"details": raw}
        raw_note = details.pop("note_to_human", None)
        note, sealed = note_of(raw_note, seal_key) if proven else (None, None)
        if not proven and raw_note is not None:
            sealed = NOTE_WITHHELD
        source = _text(entry.get("source"))
        received = entry.get("received_at")
        job = jobs.get(str(entry.get("message_id")))
        if job is not None:
            details.pop(OVERLAPS, None)  # shown by number in the job's line, not as ids
        rows.append(
            {
                "message_id": _text(entry.get("message_id")),
                "emitted_at": _text(entry.get("emitted_at")),
                "received_at": received if isinstance(received, int | float) else None,
                "type": _text(entry.get("type")),
                "source": source,
                "source_name": None if source is None else names.get(source),
                "message_source": _text(entry.get("message_source")),
                "note": note,
                "sealed": sealed,
                "details": json.dumps(details, default=str, sort_keys=True),
                "new": index >= unread_from,
                "job": None if job is None else job_row(job, every),
            }
        )
    rows.reverse()
    return rows[:INBOX_SHOWN], len(entries) - unread_from


def job_row(job: Job, jobs: list[Job]) -> dict[str, Any]:
    """Return what the inbox shows of a job: its number, its decision, what it overlaps.

    The same words as `vox inbox` (its decision "approved at ...: outcome", or "undecided"
    and each job it overlaps with that job's state).
    """
    decision = None
    if job.decision is not None:
        decision = {
            "verdict": _text(job.decision.get("verdict")),
            "word": verdict_word(job.decision.get("verdict")),
            "decided_at": _text(job.decision.get("decided_at")),
            "outcome": _text(job.decision.get("outcome")),
            "note": _text(job.decision.get("note")),
        }
    overlaps = []
    for number in job.overlaps:
        other = jobs[number - 1]
        state = "undecided" if other.decision is None else verdict_word(other.decision["verdict"])
        overlaps.append({"number": number, "state": state})
    return {
        "number": job.number,
        "message_id": job.message_id,
        "end_time": job.end_time,
        "decision": decision,
        "overlaps": overlaps,
    }


def _details(row: Mapping[str, Any]) -> dict[str, Any]:
    details = row.get("details")
    return details if isinstance(details, dict) else {}


def _deadline_passed(deadline: Any, now: float) -> bool:
    if not isinstance(deadline, str):
        return False
    try:
        return datetime.fromisoformat(deadline).timestamp() < now
    except ValueError:
        return False


def request_rows(
    rows: list[dict[str, Any]],
    me: str,
    now: float,
    names: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Return the command_requests this side sent, newest first, each with its state.

    rows are ledger rows in any order. A request is SENT, then ACKNOWLEDGED when the
    receiver's acknowledgement was recorded, PROGRESS while other replies come, and ends
    ANSWERED (its command_result), FAILED (a command_error, or this side's "failed" row) or
    EXPIRED (this side's "expired" row: no answer by its deadline). `overdue` marks one
    still in flight past its deadline. `door` is what it came through (cli, web, mcp, a2a)
    when the console noted it (a "door" row, console/home/api.py) or the request says it;
    names turn each id into the agent's name (`*_name`, None when unknown).
    """
    names = names or {}
    found: dict[str, dict[str, Any]] = {}
    doors: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: int(r["id"])):
        mid, kind, action = row.get("message_id"), row.get("message_type"), row.get("action")
        details = _details(row)
        if row.get("event_type") == "door" and action == LedgerAction.VIA:
            request_id, door = details.get("request_id"), details.get("door")
            # The door its command came through, not a later cancel's (`what`).
            command = details.get("what") in (None, "command")
            if isinstance(request_id, str) and isinstance(door, str) and command:
                doors.setdefault(request_id, door)
            continue
        if kind == MSG_COMMAND_REQUEST and action == LedgerAction.SENT and row.get("source") == me:
            if mid is None or mid in found:
                continue
            params = details.get("params")
            found[mid] = {
                "message_id": mid,
                "command": _text(details.get("command")),
                "params": json.dumps(params if isinstance(params, dict) else {}, sort_keys=True),
                "target": row.get("target"),
                "door": _text(details.get("door")),
                "sent_at": row.get("recorded_at"),
                "deadline": _text(details.get("deadline")),
                "state": "SENT",
                "code": None,
                "reason": None,
                "handled_by": None,
                "ended_at": None,
                "replies": 0,
            }
            continue
        if kind == MSG_COMMAND_REQUEST and action in _ENDS and mid in found:
            request = found[mid]
            if request["state"] in _IN_FLIGHT:
                request.update(state=_ENDS[action], reason=row.get("reason"))
                request["ended_at"] = row.get("recorded_at")
            continue
        parent = row.get("reply_to")
        if action != LedgerAction.RECEIVED or parent not in found:
            continue
        request = found[parent]
        request["replies"] += 1
        if request["state"] not in _IN_FLIGHT:
            continue
        if kind == MSG_ACKNOWLEDGED:
            if request["state"] == "SENT":
                request["state"] = "ACKNOWLEDGED"
        elif kind == MSG_COMMAND_RESULT:
            request.update(state="ANSWERED", handled_by=_text(details.get("handled_by")))
            request["ended_at"] = row.get("recorded_at")
        elif kind == MSG_COMMAND_ERROR:
            request.update(state="FAILED", code=_text(details.get("code")))
            request["ended_at"] = row.get("recorded_at")
        else:
            request["state"] = "PROGRESS"
    out = list(found.values())
    for request in out:
        request["door"] = request["door"] or doors.get(request["message_id"])
        request["target_name"] = names.get(str(request["target"]))
        request["handled_by_name"] = names.get(str(request["handled_by"]))
        request["in_flight"] = request["state"] in _IN_FLIGHT
        request["overdue"] = request["in_flight"] and _deadline_passed(request["deadline"], now)
    out.reverse()
    return out[:REQUESTS_SHOWN]


def timeline_rows(
    chain: list[dict[str, Any]], names: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Return one request's timeline (`VOXAgentMemory.trace`): one line per message."""
    names = names or {}
    lines = []
    for row in chain[:TIMELINE_MAX]:
        details = _details(row)
        note = {
            key: details[key]
            for key in ("command", "code", "handled_by", "deadline")
            if isinstance(details.get(key), str)
        }
        if "handled_by" in note:
            note["handled_by"] = names.get(note["handled_by"], note["handled_by"])
        lines.append(
            {
                "recorded_at": row.get("recorded_at"),
                "actions": [a for a in row.get("actions", [row.get("action")]) if a],
                "message_type": row.get("message_type"),
                "message_id": row.get("message_id"),
                "source": row.get("source"),
                "target": row.get("target"),
                "source_name": names.get(str(row.get("source"))),
                "target_name": names.get(str(row.get("target"))),
                "reason": row.get("reason"),
                "note": note,
            }
        )
    return lines


def _read_tail(path: Path) -> str:
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > INBOX_TAIL:
            handle.seek(size - INBOX_TAIL)
        return handle.read(INBOX_TAIL).decode("utf-8", errors="replace")


def _read_mark(path: Path) -> str | None:
    try:
        return str(UUID(path.read_text(encoding="utf-8").strip()))
    except (OSError, ValueError):
        return None


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@dataclass
class OperatorPages:
    """Read the operator's inbox and ledger from its state dir, read-only."""

    state_dir: Path
    operator_id: UUID
    names: dict[str, str]  # id -> name, for the sources of notifications
    seal_key: SealKey | None = None  # the operator's, to open sealed notes (docs/security.md)
    # The live view's names (id -> name), set by the app that serves these pages.
    live_names: Callable[[], dict[str, str]] | None = None
    _memory: VOXAgentMemory | None = None
    _inbox_seen: tuple[tuple[int, int] | None, ...] | None = None
    _head_seen: int | None = None

    @property
    def inbox_path(self) -> Path:
        """Return the notifications file of the operator's session."""
        return self.state_dir / "inbox.jsonl"

    def all_names(self) -> dict[str, str]:
        """Return every name known: the live view's, then the config's own."""
        live = {} if self.live_names is None else self.live_names()
        return {**live, **self.names}

    def decisions(self) -> list[dict[str, Any]]:
        """Return the decisions the operator's console recorded (decisions.jsonl)."""
        try:
            text = (self.state_dir / "decisions.jsonl").read_text(encoding="utf-8")
        except OSError:
            return []
        return parse_inbox(text)

    @property
    def ledger_path(self) -> Path:
        """Return the operator's ledger."""
        return self.state_dir / "logs.db"

    def inbox(self, *, proven: bool) -> dict[str, Any]:
        """Return the inbox page: the newest notifications first, or why there is none.

        proven: the request proved the operator, so notes are opened (F28, inbox_rows).
        """
        path = self.inbox_path
        try:
            entries = parse_inbox(_read_tail(path))
        except FileNotFoundError:
            entries = []
        except OSError as exc:
            return {"entries": [], "unread": 0, "error": f"cannot read {path}: {_why(exc)}"}
        last = _read_mark(path.with_name("inbox.read"))
        rows, unread = inbox_rows(
            entries,
            last,
            self.all_names(),
            self.seal_key,
            proven=proven,
            decisions=self.decisions(),
        )
        return {"entries": rows, "unread": unread, "total": len(entries), "error": None}

    async def _ledger(self) -> VOXAgentMemory | None:
        if self._memory is None:
            if not self.ledger_path.is_file():
                return None  # nothing sent yet: the first request creates it
            memory = VOXAgentMemory(self.ledger_path, read_only=True)
            await memory.init_db()
            self._memory = memory
        return self._memory

    async def requests(self, now: float) -> dict[str, Any]:
        """Return the requests page: the newest requests first, with their states."""
        try:
            memory = await self._ledger()
            rows = [] if memory is None else await memory.get_recent(LEDGER_ROWS)
        except LedgerError as exc:
            return {"requests": [], "error": str(exc)}
        names = self.all_names()
        found = request_rows(rows, str(self.operator_id), now, names)
        return {"requests": found, "error": None}

    async def request(self, message_id: UUID, now: float) -> dict[str, Any] | None:
        """Return one request's row and timeline, or None when the ledger has no such one."""
        try:
            memory = await self._ledger()
            if memory is None:
                return None
            own = await memory.find(message_id)
            chain = await memory.trace(message_id)
            recent = await memory.get_recent(LEDGER_ROWS)
        except LedgerError as exc:
            return {"request": None, "timeline": [], "error": str(exc)}
        replies = [r for r in chain if r.get("message_id") != str(message_id)]
        doors = [r for r in recent if r.get("event_type") == "door"]
        names = self.all_names()
        rows = request_rows([*own, *replies, *doors], str(self.operator_id), now, names)
        if not rows:
            return None
        return {"request": rows[0], "timeline": timeline_rows(chain, names), "error": None}

    async def changed(self) -> dict[str, bool]:
        """Say which of the inbox (or its read mark) and the ledger changed since last asked."""
        files = ("inbox.read", "decisions.jsonl")
        seen = tuple(
            _signature(p) for p in (self.inbox_path, *(self.inbox_path.with_name(f) for f in files))
        )
        inbox = seen != self._inbox_seen
        self._inbox_seen = seen
        try:
            memory = await self._ledger()
            head = None if memory is None else (await memory.head())[0]
        except LedgerError:
            head = None
        requests = head != self._head_seen
        self._head_seen = head
        return {"inbox": inbox, "requests": requests}

    async def close(self) -> None:
        """Close the read-only ledger connection."""
        if self._memory is not None:
            await self._memory.close()
            self._memory = None
