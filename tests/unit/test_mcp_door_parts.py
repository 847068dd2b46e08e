"""The MCP door's pure parts (cli/_mcpserver.py): progress, the summary, a command's tool."""

from __future__ import annotations

from vox_mqtt.cli._mcpserver import command_tool, progress_of, status_summary, tool_command


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


def test_a_root_command_becomes_a_tool_with_its_handlers_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tool = command_tool("stuck", {"doc": "Run until cancelled.", "schema": schema})
    assert tool is not None
    assert tool.name == "cmd_stuck"
    assert tool.input_schema == schema
    assert (tool.description or "").startswith("Run until cancelled.")
    assert tool_command("cmd_stuck") == "stuck"
    assert tool_command("send_command") is None
    # Without a known schema (an older agent): any object; a name no client takes: no tool.
    older = command_tool("old", {})
    assert older is not None
    assert older.input_schema == {"type": "object"}
    assert command_tool("has space", {}) is None
    assert command_tool("x" * 61, {}) is None
