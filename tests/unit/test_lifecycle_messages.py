"""The lifecycle types' own rules: bounded nesting, no names carried up, frozen views."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import pytest

from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.lifecycle import (
    CANCEL_STATES,
    FINAL_STATES,
    MAX_DEPTH,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_REPORT,
    REQUEST_STATES,
    CommandProgress,
    StatusReport,
)
from vox_mqtt.protocol.messages import ErrorCode, new_message, parse, serialize


def message_bytes(type: str, details: Any) -> bytes:
    return json.dumps(
        {
            "message_id": str(uuid4()),
            "message_source": "tests",
            "emitted_at": "2026-01-11T08:00:00-03:00",
            "source": str(uuid4()),
            "target": str(uuid4()),
            "type": type,
            "details": details,
            "reply_to": str(uuid4()),
        }
    ).encode()


def nested_progress(levels: int) -> dict[str, Any]:
    part: dict[str, Any] = {"state": "working", "seq": 1}
    for _ in range(levels - 1):
        part = {"state": "delegated", "seq": 1, "below": part}
    return part


def test_progress_nesting_is_bounded() -> None:
    parse(message_bytes(MSG_COMMAND_PROGRESS, nested_progress(MAX_DEPTH)))
    with pytest.raises(InvalidMessage, match=f"nests more than {MAX_DEPTH} levels"):
        parse(message_bytes(MSG_COMMAND_PROGRESS, nested_progress(MAX_DEPTH + 1)))


def test_status_nesting_is_bounded() -> None:
    part: dict[str, Any] = {"state": "working"}
    for _ in range(MAX_DEPTH):
        part = {"state": "delegated", "below": part}
    with pytest.raises(InvalidMessage, match="nests more than"):
        parse(message_bytes(MSG_STATUS_REPORT, {"request_id": str(uuid4()), **part}))


def test_a_childs_extra_fields_never_travel_up() -> None:
    # A relay re-sends what it validated: whatever a child adds (a name, an id) is dropped.
    details = {
        "state": "delegated",
        "seq": 3,
        "agent": "specialist-7",
        "below": {"state": "working", "seq": 1, "handled_by": str(uuid4())},
    }
    progress = parse(message_bytes(MSG_COMMAND_PROGRESS, details)).payload()
    assert isinstance(progress, CommandProgress)
    assert progress.model_dump(mode="json", exclude_none=True) == {
        "state": "delegated",
        "seq": 3,
        "below": {"state": "working", "seq": 1},
    }


def test_nan_fraction_is_refused() -> None:
    details = {"state": "working", "seq": 1, "fraction": "nan"}
    with pytest.raises(InvalidMessage, match=r"details\.fraction"):
        parse(message_bytes(MSG_COMMAND_PROGRESS, details))


def test_a_report_built_from_models_round_trips() -> None:
    report = StatusReport.model_validate(
        {
            "request_id": str(uuid4()),
            "state": "delegated",
            "since": "2026-01-11T08:00:01Z",
            "below": {"state": "working", "since": "2026-01-11T08:00:02Z"},
        }
    )
    message = new_message(MSG_STATUS_REPORT, source=uuid4(), target=uuid4(), details=report)
    again = parse(serialize(message)).payload()
    assert again == report


def test_state_sets() -> None:
    assert FINAL_STATES < REQUEST_STATES
    assert FINAL_STATES | {"canceling", "unknown"} == CANCEL_STATES
    assert ErrorCode.CANCELED == "CANCELED"
