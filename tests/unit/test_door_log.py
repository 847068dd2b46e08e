"""Which door each of the operator's acts came through (console/doorlog.py)."""

from __future__ import annotations

import json
from uuid import uuid4

import pytest

from vox_mqtt.cli.lifecycle import door_line
from vox_mqtt.console.doorlog import door_details, door_summary


def test_a_door_row_names_the_request_the_door_and_what_came() -> None:
    request = uuid4()
    details = door_details(request, "a2a", "cancel", command=None, verdict="reject")
    assert details == {
        "request_id": str(request),
        "door": "a2a",
        "what": "cancel",
        "verdict": "reject",
    }
    with pytest.raises(ValueError, match="door is one of cli, web, mcp, a2a"):
        door_details(request, "telnet", "command")


def test_the_summary_reads_rows_old_and_new_parsed_or_not() -> None:
    request = str(uuid4())
    rows = [
        # Before `what` was recorded: its command's door (sqlite3 gives the text).
        {"details": json.dumps({"request_id": request, "door": "mcp"}), "recorded_at": "t1"},
        {"details": {"request_id": request, "door": "cli", "what": "cancel"}, "recorded_at": "t2"},
        {"details": {"door": "ssh"}, "recorded_at": "t3"},  # not a door: skipped
        {"details": "not json", "recorded_at": "t4"},
    ]
    summary = door_summary(rows)
    assert summary == {
        "door": "mcp",
        "doors": [
            {"door": "mcp", "what": "command", "at": "t1"},
            {"door": "cli", "what": "cancel", "at": "t2"},
        ],
    }
    assert door_line(summary) == "came through mcp (command), cli (cancel)"
    assert door_summary([]) == {"door": None, "doors": []}
    assert door_line({}) is None
