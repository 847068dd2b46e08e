"""The operator's views of a request's life, as pure functions: ids, levels, transitions,
in-flight counts (docs/operations.md, "Find and cancel a stuck command")."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from vox_mqtt.cli._inflight import in_flight, in_flight_text
from vox_mqtt.cli.follow import describe, transition_line
from vox_mqtt.cli.lifecycle import level_lines, parse_request_id, resolve_request_id

NOW = datetime(2026, 12, 4, 12, 0, 10, tzinfo=UTC)


def test_a_request_id_is_a_uuid_or_its_start_and_anything_else_is_one_clear_line() -> None:
    given = uuid4()
    assert parse_request_id(f" {given} ") == str(given)
    assert parse_request_id(given.hex[:10].upper()) == str(given)[:11]  # hyphens put back
    with pytest.raises(ValueError, match=r"^not a request id \(a UUID or the start of one\)"):
        parse_request_id("abc-xyz")
    with pytest.raises(ValueError, match=r"too short: give at least 4 hex digits"):
        parse_request_id("83")


def test_a_prefix_is_resolved_among_the_requests_this_console_sent(tmp_path: Path) -> None:
    ledger = tmp_path / "logs.db"
    mine, other, received = (
        UUID("1cfb61d0-91e9-4856-96d1-17c31cfda345"),
        UUID("1cfb61d0-0000-4856-96d1-17c31cfda345"),
        UUID("2222aaaa-91e9-4856-96d1-17c31cfda345"),
    )
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        db.execute("CREATE TABLE logs (action TEXT, message_type TEXT, message_id TEXT)")
        db.executemany(
            "INSERT INTO logs VALUES (?, ?, ?)",
            [
                ("sent", "command_request", str(mine)),
                ("sent", "command_request", str(other)),
                ("received", "command_request", str(received)),
            ],
        )
        db.commit()
    assert resolve_request_id(ledger, "1cfb61d0-91e9") == mine
    with pytest.raises(ValueError, match=r"ambiguous .* it starts 2 of them"):
        resolve_request_id(ledger, "1cfb61d0")
    # Only what this console sent: another agent's request is no candidate.
    with pytest.raises(ValueError, match=r"^no request id starting with '2222aaaa'"):
        resolve_request_id(ledger, "2222aaaa")
    # A whole id goes to the root as given, known here or not.
    assert resolve_request_id(tmp_path / "none.db", str(received)) == received
    with pytest.raises(ValueError, match=r"this console sent none yet"):
        resolve_request_id(tmp_path / "none.db", "2222")


def test_each_level_is_one_line_the_root_named_the_others_numbered() -> None:
    report = {
        "request_id": str(uuid4()),
        "state": "delegated",
        "since": "2026-12-04T12:00:00.000+00:00",
        "below": {
            "state": "delegated",
            "since": "2026-12-04T12:00:01.000+00:00",
            "below": {"state": "unreachable", "why": "no answer within 2.0s"},
        },
    }
    assert level_lines(report, "root", NOW) == [
        "root: delegated since 2026-12-04T12:00:00.000+00:00 (10.0s ago)",
        "  └ level 2: delegated since 2026-12-04T12:00:01.000+00:00 (9.0s ago)",
        "    └ level 3: unreachable — no answer within 2.0s",
    ]
    # A since that is not a time is shown as it came, without an age.
    assert level_lines({"state": "working", "since": "soon"}, "root", NOW) == [
        "root: working since soon"
    ]


def test_progress_reads_top_down_and_names_no_agent() -> None:
    details = {
        "state": "delegated",
        "seq": 3,
        "below": {"state": "working", "fraction": 0.4, "text": "parsing", "seq": 7},
    }
    assert describe(details) == "delegated > working 40% parsing"
    assert describe({"state": "working", "fraction": None, "text": None}) == "working"


def test_a_transition_line_has_its_time_and_the_time_since_sent() -> None:
    first = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
    progress = {
        "state": "progress",
        "at": "2026-12-04T12:00:01.250+00:00",
        "details": {"state": "working", "fraction": 0.5, "text": "half"},
    }
    assert transition_line(progress, first) == "12:00:01.250 +1.250s progress working 50% half"
    delegated = {"state": "delegated", "at": "2026-12-04T12:00:00.010+00:00", "details": {}}
    assert transition_line(delegated, first) == "12:00:00.010 +0.010s delegated"
    delegated["details"] = {"state": "delegated", "below": {"state": "working"}}
    assert transition_line(delegated, first) == "12:00:00.010 +0.010s delegated working"
    sent = {"state": "sent", "at": "2026-12-04T12:00:00.000+00:00", "details": {}}
    assert transition_line(sent, first) == "12:00:00.000 +0.000s sent"
    failed = {"state": "canceled", "at": "bad", "details": {"code": "CANCELED", "error": "by op"}}
    assert transition_line(failed, first) == "? canceled CANCELED: by op"


def test_in_flight_counts_come_from_the_heartbeat_gauges() -> None:
    metrics = {
        "agent": {
            "v": 1,
            "counters": {},
            "gauges": {"requests_received": 0, "requests_working": 2, "requests_delegated": 1},
            "histograms": {},
        }
    }
    counts = in_flight(metrics)
    assert counts == {"received": 0, "working": 2, "delegated": 1}
    assert in_flight_text(counts) == "2 working, 1 delegated"
    assert in_flight_text({"received": 0, "working": 0, "delegated": 0}) == "0"
    # An agent that says nothing of it (an older version, metrics off): unknown, not 0.
    assert in_flight({"agent": {"v": 1, "counters": {}, "gauges": {}, "histograms": {}}}) is None
    assert in_flight(None) is None
    assert in_flight_text(None) == "-"
