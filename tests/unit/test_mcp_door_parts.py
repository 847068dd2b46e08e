"""The MCP door's pure parts (cli/_mcpserver.py): progress read from nested levels, the summary."""

from __future__ import annotations

from vox_mqtt.cli._mcpserver import progress_of, status_summary


def test_progress_is_read_from_the_deepest_level() -> None:
    details = {"state": "delegated", "below": {"fraction": 0.5, "text": "step 2", "below": None}}
    assert progress_of(details) == (0.5, "step 2")
    assert progress_of({"fraction": 0.25, "text": "own"}) == (0.25, "own")
    assert progress_of({"fraction": True, "text": 3}) == (None, None)
    assert progress_of({}) == (None, None)


def test_the_status_summary_counts_by_status_and_names_the_root() -> None:
    document = {
        "agents": [
            {"name": "root", "id": "r", "status": "ACTIVE", "commands": ["echo"], "cpu": 1},
            {"name": "leaf", "id": "l", "status": "DOWN", "master_id": "r"},
            "junk",
        ]
    }
    summary = status_summary(document, "r")
    assert summary["agents"] == 2
    assert summary["by_status"] == {"ACTIVE": 1, "DOWN": 1}
    assert summary["root"] == "root"
    assert summary["list"][1] == {"name": "leaf", "id": "l", "master_id": "r", "status": "DOWN"}
    assert status_summary({}, None) == {"agents": 0, "by_status": {}, "root": None, "list": []}
