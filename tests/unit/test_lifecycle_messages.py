"""The lifecycle types' own rules: bounded nesting, no names carried up, frozen views."""

from __future__ import annotations

import json
from typing import Any, get_args
from uuid import UUID, uuid4

import pytest

from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.lifecycle import (
    CANCEL_STATES,
    FINAL_STATES,
    MAX_DEPTH,
    MSG_CANCEL_REPORT,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_REPORT,
    REQUEST_STATES,
    CancelReport,
    CancelState,
    CommandProgress,
    ProgressState,
    RequestState,
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
    assert set(RequestState) == REQUEST_STATES
    assert set(get_args(CancelState)) == CANCEL_STATES
    assert set(get_args(ProgressState)) == {"working", "delegated"}


REQUEST = UUID("12345678-1234-4234-8234-123456789abc")
AT = "2026-01-11T08:00:01Z"
# Each payload as the wire carried it before the states were an enum: byte for byte.
WIRE = [
    (
        MSG_COMMAND_PROGRESS,
        CommandProgress,
        {"state": "delegated", "seq": 2, "below": {"state": "working", "fraction": 0.5, "seq": 7}},
        '{"state":"delegated","seq":2,"below":{"state":"working","fraction":0.5,"seq":7}}',
    ),
    (
        MSG_STATUS_REPORT,
        StatusReport,
        {
            "request_id": str(REQUEST),
            "state": "delegated",
            "since": AT,
            "history": [{"state": "received", "at": AT}, {"state": "delegated", "at": AT}],
            "below": {"state": "unreachable", "why": "no answer"},
        },
        '{"state":"delegated","since":"2026-01-11T08:00:01Z","history":'
        '[{"state":"received","at":"2026-01-11T08:00:01Z"},'
        '{"state":"delegated","at":"2026-01-11T08:00:01Z"}],'
        '"below":{"state":"unreachable","history":[],"why":"no answer"},'
        '"request_id":"12345678-1234-4234-8234-123456789abc"}',
    ),
    (
        MSG_CANCEL_REPORT,
        CancelReport,
        {"request_id": str(REQUEST), "state": "canceling", "since": AT},
        '{"request_id":"12345678-1234-4234-8234-123456789abc","state":"canceling",'
        '"since":"2026-01-11T08:00:01Z"}',
    ),
]


@pytest.mark.parametrize(
    ("kind", "model", "details", "text"), WIRE, ids=[kind for kind, *_ in WIRE]
)
def test_a_payload_s_json_is_the_plain_words(
    kind: str, model: Any, details: Any, text: str
) -> None:
    payload = model.model_validate(details)
    assert type(payload.state) is RequestState
    assert payload.model_dump_json(exclude_none=True) == text
    # As a message carries it (messages.new_message dumps it in JSON mode), and as a plain
    # dump passed to json.dumps (a member is its text).
    dumped = json.dumps(payload.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
    assert dumped == text
    plain = json.dumps(payload.model_dump(exclude_none=True), separators=(",", ":"), default=str)
    assert plain == text
    message = new_message(kind, source=uuid4(), target=uuid4(), details=payload)
    assert json.loads(serialize(message))["details"] == json.loads(text)


def test_a_state_read_from_the_wire_is_a_member() -> None:
    report = StatusReport.model_validate(WIRE[1][2])
    assert report.state is RequestState.DELEGATED
    assert report.history[0].state is RequestState.RECEIVED
    assert report.below is not None
    assert report.below.state == "unreachable"
    progress = CommandProgress.model_validate({"state": RequestState.WORKING, "seq": 1})
    assert progress.state is RequestState.WORKING


# A state a payload does not allow is refused in the words a Literal of strings used, so the
# reason a refused message is recorded with stays as it was.
REFUSED = [
    (MSG_COMMAND_PROGRESS, {"state": "finished", "seq": 1}, "'working' or 'delegated'"),
    (
        MSG_STATUS_REPORT,
        {"request_id": str(REQUEST), "state": "lost"},
        "'received', 'working', 'delegated', 'canceling', 'completed', 'failed', 'canceled',"
        " 'expired', 'rejected', 'unknown' or 'unreachable'",
    ),
    (
        MSG_STATUS_REPORT,
        {"request_id": str(REQUEST), "state": "working", "history": [{"state": 3, "at": AT}]},
        "'received', 'working', 'delegated', 'canceling', 'completed', 'failed', 'canceled',"
        " 'expired', 'rejected' or 'unknown'",
    ),
    (
        MSG_CANCEL_REPORT,
        {"request_id": str(REQUEST), "state": "working"},
        "'completed', 'failed', 'canceled', 'canceling', 'expired', 'rejected' or 'unknown'",
    ),
]


@pytest.mark.parametrize(("kind", "details", "allowed"), REFUSED)
def test_a_state_not_allowed_is_refused_in_plain_words(
    kind: str, details: Any, allowed: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        parse(message_bytes(kind, details))
    assert f"state: Input should be {allowed}" in str(refused.value)
    assert str(refused.value).count("Input should be") == 1
    assert "RequestState" not in str(refused.value)
