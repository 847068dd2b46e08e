"""Every payload model of seeds 000 and 003: what it accepts and what it refuses, and why."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import pytest

from vox_mqtt.protocol.domain import (
    MSG_DATA_REQUEST,
    MSG_DATA_RESPONSE,
    MSG_DECISION,
    MSG_DECISION_RECORDED,
    MSG_JOB_DETECTED,
    MSG_SYSTEM_FAILURE,
    DataRequest,
    DataResponse,
    Decision,
    JobDetected,
    Price,
    SystemFailure,
)
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.lifecycle import (
    MSG_CANCEL_REPORT,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
    MSG_STATUS_REPORT,
    CancelReport,
    CancelRequest,
    CommandProgress,
    StatusQuery,
    StatusReport,
)
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    PAYLOAD_MODELS,
    CommandError,
    CommandRequest,
    CommandResult,
    MessageAcknowledged,
    parse,
    serialize,
)

AN_ID = "fa703dc8-0003-46f0-b4be-8dd0a5f398ac"
JOB = {
    "start_time": "2026-01-11T08:15:00-03:00",
    "end_time": "2026-01-11T16:00:00-03:00",
    "estimated_effort_minutes": 60,
    "price": {"currency": "USD", "value": 30},
    "note_to_human": "Client: Netwire\nProject O-26-XXXXX-TRA-YYY",
}
DATA_REQUEST = {
    "subject": "financial_summary",
    "parameters": {
        "start_date": "2026-01-01T00:00:00-03:00",
        "end_date": "2026-01-31T23:59:59-03:00",
    },
}
DATA_RESPONSE = {
    "request_id": AN_ID,
    "total": {"currency": "BRL", "value": 125000},
    "attachments": ["path/to/file.pdf"],
}
FAILURE = {
    "error_code": "VM_CONNECTION_LOST",
    "severity": "CRITICAL",
    "description": "Associated Virtual Machine is unreachable",
}


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
        }
    ).encode()


def with_changes(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    merged = {**base, **changes}
    return {key: value for key, value in merged.items() if value is not ...}


VALID = [
    (MSG_COMMAND_REQUEST, {"command": "analyze", "params": {"target": "..."}}, CommandRequest),
    (MSG_COMMAND_REQUEST, {"command": "analyze"}, CommandRequest),
    (
        MSG_COMMAND_REQUEST,
        {"command": "analyze", "params": {}, "deadline": "2026-01-11T08:05:00Z"},
        CommandRequest,
    ),
    (MSG_ACKNOWLEDGED, {"in_response_to": AN_ID}, MessageAcknowledged),
    (MSG_COMMAND_RESULT, {"result": "..."}, CommandResult),
    (
        MSG_COMMAND_RESULT,
        {"command": "analyze", "result": {"score": 3}, "summary": "ok", "handled_by": AN_ID},
        CommandResult,
    ),
    (MSG_COMMAND_RESULT, {}, CommandResult),
    (MSG_COMMAND_ERROR, {"code": "NO_ROUTE", "error": "nobody handles analyze"}, CommandError),
    (
        MSG_COMMAND_ERROR,
        {"code": "QUOTA_EXCEEDED", "error": "new codes may be added", "command": "analyze"},
        CommandError,
    ),
    (MSG_SYSTEM_FAILURE, FAILURE, SystemFailure),
    (
        MSG_SYSTEM_FAILURE,
        {**FAILURE, "subject": AN_ID, "epoch": 7, "resolved": True},
        SystemFailure,
    ),
    (MSG_JOB_DETECTED, JOB, JobDetected),
    (MSG_JOB_DETECTED, with_changes(JOB, note_to_human=...), JobDetected),
    (MSG_JOB_DETECTED, with_changes(JOB, end_time=JOB["start_time"]), JobDetected),
    (MSG_JOB_DETECTED, with_changes(JOB, price={"currency": "EUR", "value": 0}), JobDetected),
    # Same instant in two offsets: the end is not before the start.
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, start_time="2026-01-11T11:15:00Z", end_time="2026-01-11T08:15:00-03:00"),
        JobDetected,
    ),
    (MSG_DATA_REQUEST, DATA_REQUEST, DataRequest),
    (MSG_DATA_REQUEST, {"subject": "headcount"}, DataRequest),
    (MSG_DATA_REQUEST, {"subject": "x", "parameters": {"region": "south"}}, DataRequest),
    (MSG_DATA_RESPONSE, DATA_RESPONSE, DataResponse),
    (MSG_DATA_RESPONSE, {"request_id": AN_ID}, DataResponse),
    (MSG_DECISION, {"in_response_to": AN_ID, "verdict": "approve"}, Decision),
    (MSG_DECISION, {"in_response_to": AN_ID, "verdict": "reject", "note": "too cheap"}, Decision),
    (
        MSG_DECISION_RECORDED,
        {"in_response_to": AN_ID, "verdict": "approve", "outcome": "booked: 60 min of work"},
        Decision,
    ),
    (MSG_COMMAND_PROGRESS, {"state": "working", "seq": 1}, CommandProgress),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "working", "fraction": 0.4, "text": "page 4 of 10", "seq": 7},
        CommandProgress,
    ),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "delegated", "seq": 2, "below": {"state": "working", "fraction": 1, "seq": 9}},
        CommandProgress,
    ),
    (MSG_STATUS_QUERY, {"request_id": AN_ID}, StatusQuery),
    (
        MSG_STATUS_REPORT,
        {
            "request_id": AN_ID,
            "state": "delegated",
            "since": "2026-01-11T08:00:01Z",
            "history": [{"state": "received", "at": "2026-01-11T08:00:00Z"}],
            "below": {"state": "unreachable", "why": "no answer within 2 s"},
        },
        StatusReport,
    ),
    (MSG_STATUS_REPORT, {"request_id": AN_ID, "state": "unknown"}, StatusReport),
    (MSG_CANCEL_REQUEST, {"request_id": AN_ID}, CancelRequest),
    (MSG_CANCEL_REQUEST, {"request_id": AN_ID, "reason": "deadline"}, CancelRequest),
    (
        MSG_CANCEL_REPORT,
        {"request_id": AN_ID, "state": "canceled", "since": "2026-01-11T08:00:00Z"},
        CancelReport,
    ),
    (MSG_CANCEL_REPORT, {"request_id": AN_ID, "state": "unknown"}, CancelReport),
]


@pytest.mark.parametrize(("type", "details", "model"), VALID)
def test_valid_payloads_parse_into_their_model(
    type: str, details: dict[str, Any], model: type
) -> None:
    message = parse(message_bytes(type, details))
    payload = message.payload()
    assert isinstance(payload, model)
    assert PAYLOAD_MODELS[type] is model
    assert message.details == details
    assert parse(serialize(message)) == message


INVALID = [
    (MSG_COMMAND_REQUEST, {}, "details.command: missing"),
    (MSG_COMMAND_REQUEST, {"command": ""}, "details.command: String should have at least 1"),
    (MSG_COMMAND_REQUEST, {"command": 5}, "details.command: Input should be a valid string"),
    (MSG_COMMAND_REQUEST, {"command": "x", "params": []}, "details.params: must be a JSON"),
    (
        MSG_COMMAND_REQUEST,
        {"command": "x", "deadline": "2026-01-11T08:05:00"},
        "details.deadline: '2026-01-11T08:05:00' has no timezone",
    ),
    (MSG_ACKNOWLEDGED, {}, "details.in_response_to: missing"),
    (MSG_ACKNOWLEDGED, {"in_response_to": "fa703dc8"}, "details.in_response_to: 'fa703dc8' is"),
    (MSG_COMMAND_RESULT, {"handled_by": "coordinator"}, "details.handled_by: 'coordinator' is"),
    (MSG_COMMAND_RESULT, {"summary": 3}, "details.summary: Input should be a valid string"),
    (MSG_COMMAND_ERROR, {"error": "boom"}, "details.code: missing"),
    (MSG_COMMAND_ERROR, {"code": "no_route", "error": "x"}, "details.code: String should match"),
    (MSG_COMMAND_ERROR, {"code": "NO_ROUTE"}, "details.error: missing"),
    (MSG_SYSTEM_FAILURE, with_changes(FAILURE, severity="FATAL"), "details.severity: Input"),
    (MSG_SYSTEM_FAILURE, with_changes(FAILURE, description=...), "details.description: missing"),
    (MSG_SYSTEM_FAILURE, with_changes(FAILURE, epoch="3"), "details.epoch: Input should be"),
    (MSG_SYSTEM_FAILURE, with_changes(FAILURE, resolved=1), "details.resolved: Input should be"),
    (MSG_SYSTEM_FAILURE, with_changes(FAILURE, error_code=""), "details.error_code: String"),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "usd", "value": 30}),
        "details.price.currency: 'usd' is not an ISO-4217 currency code",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "US", "value": 30}),
        "details.price.currency: 'US' is not an ISO-4217",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "USDT", "value": 30}),
        "details.price.currency: 'USDT' is not an ISO-4217",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": 840, "value": 30}),
        "details.price.currency: Input should be a valid string",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "USD", "value": -1}),
        "details.price.value: Input should be greater than or equal to 0",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "USD", "value": 30.5}),
        "details.price.value: Input should be a valid integer",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "USD", "value": "30"}),
        "details.price.value: Input should be a valid integer",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, price={"currency": "USD", "value": 30, "cents": 5}),
        "details.price.cents: unexpected field",
    ),
    (MSG_JOB_DETECTED, with_changes(JOB, price="USD 30"), "details.price: must be a JSON object"),
    (MSG_JOB_DETECTED, with_changes(JOB, price=...), "details.price: missing"),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, end_time="2026-01-11T08:00:00-03:00"),
        "details: end_time 2026-01-11T08:00:00-03:00 is before start_time "
        "2026-01-11T08:15:00-03:00",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, start_time="2026-01-11T08:15:00"),
        "details.start_time: '2026-01-11T08:15:00' has no timezone",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, estimated_effort_minutes=-5),
        "details.estimated_effort_minutes: Input should be greater than or equal to 0",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, estimated_effort_minutes="60"),
        "details.estimated_effort_minutes: Input should be a valid integer",
    ),
    (
        MSG_JOB_DETECTED,
        with_changes(JOB, estimated_effort_minutes=True),
        "details.estimated_effort_minutes: Input should be a valid integer",
    ),
    (MSG_JOB_DETECTED, with_changes(JOB, note_to_human=7), "details.note_to_human: Input"),
    (MSG_DATA_REQUEST, {"parameters": {}}, "details.subject: missing"),
    (
        MSG_DATA_REQUEST,
        {"subject": "financial_summary", "parameters": {"start_date": "2026-01-01"}},
        "details: parameters.start_date: '2026-01-01' has no timezone",
    ),
    (
        MSG_DATA_REQUEST,
        {"subject": "financial_summary", "parameters": {"end_date": 20260131}},
        "details: parameters.end_date must be an ISO-8601 string",
    ),
    (
        MSG_DATA_REQUEST,
        {
            "subject": "financial_summary",
            "parameters": {
                "start_date": "2026-02-01T00:00:00Z",
                "end_date": "2026-01-01T00:00:00Z",
            },
        },
        "details: parameters.end_date 2026-01-01T00:00:00Z is before parameters.start_date",
    ),
    (MSG_DATA_RESPONSE, {"total": {"currency": "USD", "value": 1}}, "details.request_id: missing"),
    (
        MSG_DATA_RESPONSE,
        with_changes(DATA_RESPONSE, total={"currency": "USD", "value": -100}),
        "details.total.value: Input should be greater than or equal to 0",
    ),
    (
        MSG_DATA_RESPONSE,
        with_changes(DATA_RESPONSE, attachments="path/to/file.pdf"),
        "details.attachments: Input should be a valid list",
    ),
    (
        MSG_DATA_RESPONSE,
        with_changes(DATA_RESPONSE, attachments=["a.pdf", 2]),
        "details.attachments.1: Input should be a valid string",
    ),
    (MSG_DECISION, {"verdict": "approve"}, "details.in_response_to: missing"),
    (
        MSG_DECISION,
        {"in_response_to": AN_ID, "verdict": "maybe"},
        "details.verdict: Input should be 'approve' or 'reject'",
    ),
    (
        MSG_DECISION_RECORDED,
        {"in_response_to": AN_ID, "verdict": "reject", "outcome": "x" * 1001},
        "details.outcome: String should have at most 1000 characters",
    ),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "working", "fraction": 1.5, "seq": 1},
        "details.fraction: Input should be less than or equal to 1",
    ),
    (MSG_COMMAND_PROGRESS, {"state": "working"}, "details.seq: missing (required)"),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "done", "seq": 1},
        "details.state: Input should be 'working' or 'delegated'",
    ),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "working", "seq": 1, "text": "x" * 201},
        "details.text: String should have at most 200 characters",
    ),
    (
        MSG_COMMAND_PROGRESS,
        {"state": "working", "seq": 1, "below": {"state": "working", "seq": 1}},
        "details: a working level has nothing below it",
    ),
    (MSG_STATUS_QUERY, {"request_id": "42"}, "details.request_id: '42' is not a UUID"),
    (
        MSG_STATUS_REPORT,
        {"request_id": AN_ID, "state": "lost"},
        "details.state: Input should be 'received'",
    ),
    (MSG_CANCEL_REQUEST, {}, "details.request_id: missing (required)"),
    (
        MSG_CANCEL_REPORT,
        {"request_id": AN_ID, "state": "working"},
        "details.state: Input should be 'completed'",
    ),
]


@pytest.mark.parametrize(("type", "details", "reason"), INVALID)
def test_invalid_payloads_are_refused_with_the_reason(
    type: str, details: dict[str, Any], reason: str
) -> None:
    data = message_bytes(type, details)
    with pytest.raises(InvalidMessage) as caught:
        parse(data)
    assert caught.value.reason.startswith(f"{type}: {reason}"), caught.value.reason
    # The envelope was readable, so the receiver can tell the sender what was wrong.
    sent = json.loads(data)
    assert caught.value.message_id == UUID(sent["message_id"])
    assert caught.value.source == UUID(sent["source"])


def test_every_payload_model_is_tested_both_ways() -> None:
    assert {entry[0] for entry in VALID} == set(PAYLOAD_MODELS)
    assert {entry[0] for entry in INVALID} == set(PAYLOAD_MODELS)


def test_payloads_keep_fields_a_later_contract_adds() -> None:
    details = {**JOB, "client_ref": "O-26", "tags": ["urgent"]}
    message = parse(message_bytes(MSG_JOB_DETECTED, details))
    job = message.payload()
    assert isinstance(job, JobDetected)
    assert job.model_extra == {"client_ref": "O-26", "tags": ["urgent"]}
    assert message.details == details


def test_payload_models_are_immutable_and_build_valid_details() -> None:
    price = Price(currency="USD", value=30)
    with pytest.raises(ValueError, match="frozen"):
        price.value = 31  # type: ignore[misc]
    job = JobDetected(
        start_time=JOB["start_time"],
        end_time=JOB["end_time"],
        estimated_effort_minutes=60,
        price=price,
    )
    assert job.model_dump(mode="json", exclude_none=True) == {**JOB, "note_to_human": ""}
