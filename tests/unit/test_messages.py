"""The VOX envelope: every parse rule, the seed documents' own examples, replies."""

from __future__ import annotations

import json
import math
import re
import time
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from vox_mqtt.protocol._jsonvalue import FrozenDict, FrozenList, freeze_json
from vox_mqtt.protocol.acks import acknowledge
from vox_mqtt.protocol.domain import (
    MSG_DATA_REQUEST,
    MSG_DATA_RESPONSE,
    MSG_DECISION,
    MSG_DECISION_RECORDED,
    MSG_JOB_DETECTED,
    MSG_SYSTEM_FAILURE,
    JobDetected,
)
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.messages import (
    CONTENT_TYPE,
    ERROR_CODES,
    MAX_MESSAGE_BYTES,
    MSG_ACKNOWLEDGED,
    MSG_CANCEL_REPORT,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_PROGRESS,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    MSG_STATUS_QUERY,
    MSG_STATUS_REPORT,
    PAYLOAD_MODELS,
    CommandRequest,
    CommandResult,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
    new_message,
    now_iso,
    parse,
    parse_timestamp,
    serialize,
)

# The seed's <placeholders>, made real.
ROOT = "e162d5c1-df06-45ae-be42-f38d234896e3"
COORDINATOR = "ff74ba58-a83d-40b4-ba17-9f4a9e2c3ced"
SPECIALIST_A = "a7ff5518-97cc-4163-9f50-148c085011da"
# The seed's elided ids "a1b2c3d4-...", "e5f6g7h8-...", "i9j0k1l2-...", "m3n4o5p6-...".
ID_A1B2 = "79bacbe0-9760-4f60-b2a6-663ae88d264d"
ID_E5F6 = "356b560e-6c23-4837-9ee1-24db33820d28"
ID_I9J0 = "fd05dac4-cef5-4c4f-83aa-dedd2e1aca39"
ID_M3N4 = "8cf752db-55c9-4e21-9c1d-217781e5297f"


def envelope(**changes: Any) -> dict[str, Any]:
    """Return a valid envelope as a dict, with some fields changed (None removes one)."""
    fields: dict[str, Any] = {
        "message_id": str(uuid4()),
        "message_source": "tests",
        "emitted_at": "2026-01-11T08:00:00-03:00",
        "source": str(uuid4()),
        "target": str(uuid4()),
        "type": "command_request",
        "details": {"command": "analyze", "params": {}},
    }
    fields.update(changes)
    return {key: value for key, value in fields.items() if value is not None}


def encode(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields).encode()


def reason_of(data: bytes) -> str:
    with pytest.raises(InvalidMessage) as caught:
        parse(data)
    assert caught.value.reason == str(caught.value)
    return caught.value.reason


# --- the envelope ---------------------------------------------------------------------------


def test_a_valid_envelope_parses_into_typed_fields() -> None:
    fields = envelope(reply_to=ID_A1B2)
    message = parse(encode(fields))
    assert message.message_id == UUID(fields["message_id"])
    assert isinstance(message.source, UUID)
    assert isinstance(message.target, UUID)
    assert message.reply_to == UUID(ID_A1B2)
    assert message.emitted_at == "2026-01-11T08:00:00-03:00"
    assert message.details == {"command": "analyze", "params": {}}


def test_reply_to_is_optional_and_absent_when_serialized() -> None:
    message = parse(encode(envelope()))
    assert message.reply_to is None
    assert b"reply_to" not in serialize(message)
    assert parse(encode(envelope(reply_to=None))).reply_to is None


def test_the_envelope_is_immutable() -> None:
    message = parse(encode(envelope()))
    with pytest.raises(ValueError, match="frozen"):
        message.type = "other"  # type: ignore[misc]


@pytest.mark.parametrize("field", ["message_id", "source", "target", "reply_to"])
@pytest.mark.parametrize(
    "value",
    [
        "not-a-uuid",
        "",
        "79bacbe097604f60b2a6663ae88d264d",
        "{79bacbe0-9760-4f60-b2a6-663ae88d264d}",
        "urn:uuid:79bacbe0-9760-4f60-b2a6-663ae88d264d",
        "79bacbe0-9760-4f60-b2a6-663ae88d264d\n",
        "79bacbe0-9760-4f60-b2a6-663ae88d264g",
        12345,
        ["79bacbe0-9760-4f60-b2a6-663ae88d264d"],
    ],
)
def test_uuid_fields_take_only_the_8_4_4_4_12_form(field: str, value: Any) -> None:
    reason = reason_of(encode(envelope(**{field: value})))
    assert reason.startswith(f"{field}: ")
    assert "UUID" in reason


def test_upper_case_uuids_are_read_and_written_back_in_lower_case() -> None:
    source = str(uuid4())
    message = parse(encode(envelope(source=source.upper())))
    assert message.source == UUID(source)
    assert f'"source":"{source}"'.encode() in serialize(message)


@pytest.mark.parametrize(
    "value",
    ["2026-01-11T08:00:00", "2026-01-11T08:00:00.123456", "2026-01-11", "2026-01-11 08:00"],
)
def test_naive_timestamps_are_rejected(value: str) -> None:
    reason = reason_of(encode(envelope(emitted_at=value)))
    assert reason.startswith("emitted_at: ")
    assert "has no timezone" in reason


@pytest.mark.parametrize("value", ["yesterday", "", "2026-13-01T00:00:00Z", "08:00:00+00:00"])
def test_timestamps_that_are_not_iso_8601_are_rejected(value: str) -> None:
    reason = reason_of(encode(envelope(emitted_at=value)))
    assert reason.startswith("emitted_at: ")
    assert "ISO-8601" in reason


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-11T08:00:00Z",
        "2026-01-11T08:00:00+00:00",
        "2026-01-11T08:00:00.123-03:00",
        "2026-01-11T08:00:00.123456+05:45",
    ],
)
def test_timestamps_with_a_timezone_are_kept_as_written(value: str) -> None:
    message = parse(encode(envelope(emitted_at=value)))
    assert message.emitted_at == value
    assert parse_timestamp(message.emitted_at).utcoffset() is not None


def test_now_iso_is_an_accepted_timestamp() -> None:
    stamp = now_iso()
    assert parse_timestamp(stamp).utcoffset() == timedelta(0)
    assert abs(datetime.fromisoformat(stamp) - parse_timestamp(now_iso())) < timedelta(hours=1)


@pytest.mark.parametrize(
    "field", ["message_id", "message_source", "emitted_at", "source", "target", "type", "details"]
)
def test_every_required_field_is_required(field: str) -> None:
    fields = envelope()
    del fields[field]
    assert f"{field}: missing (required)" in reason_of(encode(fields))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("message_source", 5),
        ("message_source", True),
        ("message_source", None),
        ("message_source", ""),
        ("emitted_at", 1736582400),
        ("type", 7),
        ("type", ""),
        ("type", "Job Detected"),
        ("type", "x" * 65),
        ("details", []),
        ("details", "analyze"),
        ("details", 1),
    ],
)
def test_wrong_types_are_not_coerced(field: str, value: Any) -> None:
    fields = envelope()
    fields[field] = value
    assert reason_of(encode(fields)).startswith(f"{field}: ")


def test_details_null_is_not_an_object() -> None:
    fields = envelope()
    fields["details"] = None
    assert reason_of(encode(fields)) == "details: must be a JSON object"


def test_an_extra_top_level_field_is_rejected() -> None:
    reason = reason_of(encode(envelope(note_to_human="call the client")))
    assert reason.startswith("note_to_human: unexpected field")


def test_several_problems_are_reported_in_one_reason() -> None:
    reason = reason_of(encode(envelope(source="x", emitted_at="2026-01-11T08:00:00", extra=1)))
    assert "source: " in reason
    assert "emitted_at: " in reason
    assert "extra: unexpected field" in reason


def test_the_size_limit_is_256_kib_by_default() -> None:
    assert MAX_MESSAGE_BYTES == 256 * 1024
    fields = envelope(type="blob", details={"blob": ""})
    room = MAX_MESSAGE_BYTES - len(encode(fields))
    fields["details"]["blob"] = "x" * room
    exactly_at_limit = encode(fields)
    assert len(exactly_at_limit) == MAX_MESSAGE_BYTES
    assert parse(exactly_at_limit).details["blob"] == "x" * room
    fields["details"]["blob"] += "x"
    reason = reason_of(encode(fields))
    assert reason == f"message is {MAX_MESSAGE_BYTES + 1} bytes, over the 262144-byte limit"


def test_the_size_limit_can_be_set_per_call() -> None:
    data = encode(envelope())
    assert parse(data, max_bytes=len(data)).type == "command_request"
    with pytest.raises(InvalidMessage, match=rf"{len(data)} bytes, over the 100-byte limit"):
        parse(data, max_bytes=100)


def test_an_oversized_message_still_names_its_sender_if_it_can() -> None:
    fields = envelope(type="blob", details={"blob": "x" * MAX_MESSAGE_BYTES})
    with pytest.raises(InvalidMessage) as caught:
        parse(encode(fields))
    assert caught.value.message_id == UUID(fields["message_id"])
    assert caught.value.source == UUID(fields["source"])


def test_an_invalid_message_names_its_sender_so_it_can_be_answered() -> None:
    fields = envelope(emitted_at="2026-01-11T08:00:00")
    with pytest.raises(InvalidMessage) as caught:
        parse(encode(fields))
    assert caught.value.message_id == UUID(fields["message_id"])
    assert caught.value.source == UUID(fields["source"])
    with pytest.raises(InvalidMessage) as caught:
        parse(b"{not json")
    assert caught.value.message_id is None
    assert caught.value.source is None


@pytest.mark.parametrize(
    ("data", "where"),
    [(b"\xff\xfe{}", 0), (b'{"message_source":"caf\xe9"}', 22), (b"{\xc3}", 1)],
)
def test_bytes_that_are_not_utf8_are_rejected(data: bytes, where: int) -> None:
    assert reason_of(data).startswith("message is not UTF-8 (")
    assert reason_of(data).endswith(f"at byte {where})")


@pytest.mark.parametrize("data", [b"[]", b"[1, 2]", b"1", b'"message"', b"null", b"true"])
def test_json_that_is_not_an_object_is_rejected(data: bytes) -> None:
    assert reason_of(data) == "message must be a JSON object"


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"{not json}", b"{}}", encode(envelope()) + b" trailing", b"\xef\xbb\xbf{}"],
)
def test_malformed_json_is_rejected(data: bytes) -> None:
    assert reason_of(data).startswith("not valid JSON (")


def test_deeply_nested_json_is_rejected_without_a_crash() -> None:
    assert "recursion limit" in reason_of(b"[" * 100_000)
    assert "recursion limit" in reason_of(b'{"a":' * 20_000 + b"1" + b"}" * 20_000)
    valid = encode(envelope(type="tree", details={"deep": 0}))
    nested = valid.replace(b'"deep": 0', b'"deep": ' + b"[" * 5000 + b"]" * 5000)
    assert "recursion limit" in reason_of(nested)


def test_moderately_nested_details_are_fine() -> None:
    deep: Any = "bottom"
    for _ in range(100):
        deep = {"level": deep}
    message = parse(encode(envelope(type="audit_trail", details={"deep": deep})))
    assert parse(serialize(message)) == message


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
def test_numbers_json_cannot_hold_are_rejected(number: bytes) -> None:
    data = encode(envelope(type="reading", details={"value": 0})).replace(b"0}", number + b"}")
    assert reason_of(data) == "details: NaN and Infinity are not JSON numbers"


def test_freezing_checks_every_number_and_freezes_every_container() -> None:
    raw = {
        "counts": [1, 2, 3],
        "le": [0.5, 1.0, 2.5],
        "mixed": [1, "a", None, True, [2.0, {"k": (3.0,)}]],
        "map": OrderedDict([(1, 4.0)]),
        "ok": 1.25,
    }
    frozen = freeze_json(raw)
    assert frozen == {
        "counts": [1, 2, 3],
        "le": [0.5, 1, 2.5],
        "mixed": [1, "a", None, True, [2, {"k": [3]}]],
        "map": {"1": 4},
        "ok": 1.25,
    }
    assert [type(x) for x in frozen["le"]] == [float, int, float]
    assert type(frozen["mixed"][4][1]["k"][0]) is int
    for container in (frozen, frozen["counts"], frozen["mixed"][4], frozen["map"]):
        assert isinstance(container, FrozenDict | FrozenList)
    assert isinstance(frozen["mixed"][4][1]["k"], FrozenList)
    assert freeze_json(frozen) is frozen  # checked when it was built
    for bad in ([1, 2, math.nan], {"a": [0.5, math.inf]}, (1, (2, -math.inf))):
        with pytest.raises(ValueError, match="NaN and Infinity"):
            freeze_json(bad)


def test_null_inside_details_survives_serialization() -> None:
    message = parse(encode(envelope(type="reading", details={"value": None, "list": [None]})))
    assert message.details == {"value": None, "list": [None]}
    assert b'"details":{"value":null,"list":[null]}' in serialize(message)


def test_serialize_is_compact_utf8_in_field_order() -> None:
    fields = envelope(type="note", details={"text": "café\n"}, reply_to=ID_A1B2)
    data = serialize(parse(encode(fields)))
    assert list(json.loads(data)) == list(fields)
    assert b" " not in data.replace(b"caf\xc3\xa9", b"")
    assert "café".encode() in data
    assert CONTENT_TYPE == "application/json"


def test_parse_accepts_bytearray_memoryview_and_text() -> None:
    data = serialize(parse(encode(envelope())))
    assert parse(bytearray(data)) == parse(memoryview(data)) == parse(data.decode()) == parse(data)


# --- unknown types ----------------------------------------------------------------------------


def test_an_unknown_type_is_accepted_with_untyped_details() -> None:
    details = {"invoice": 42, "lines": [{"sku": "A-1", "qty": 2.5}], "paid": True}
    message = parse(encode(envelope(type="invoice_paid", details=details)))
    assert message.type == "invoice_paid"
    assert message.payload() is None
    assert message.details == details
    assert parse(serialize(message)) == message


def test_every_type_constant_has_a_payload_model() -> None:
    constants = {
        MSG_COMMAND_REQUEST,
        MSG_ACKNOWLEDGED,
        MSG_COMMAND_RESULT,
        MSG_COMMAND_ERROR,
        MSG_SYSTEM_FAILURE,
        MSG_JOB_DETECTED,
        MSG_DATA_REQUEST,
        MSG_DATA_RESPONSE,
        MSG_DECISION,
        MSG_DECISION_RECORDED,
        MSG_COMMAND_PROGRESS,
        MSG_STATUS_QUERY,
        MSG_STATUS_REPORT,
        MSG_CANCEL_REQUEST,
        MSG_CANCEL_REPORT,
    }
    assert set(PAYLOAD_MODELS) == constants
    assert len(constants) == 15


def test_error_codes_are_the_designed_set() -> None:
    assert {
        "NO_ROUTE",
        "TARGET_INACTIVE",
        "TIMEOUT",
        "HANDLER_ERROR",
        "INVALID_MESSAGE",
        "INVALID_PARAMS",
        "UNAUTHORIZED_SOURCE",
        "DELIVERY_FAILED",
        "SHUTTING_DOWN",
        "MESSAGE_TOO_LARGE",
        "LEDGER_UNAVAILABLE",
        "CANCELED",
        "BUSY",
    } == ERROR_CODES
    assert ErrorCode.NO_ROUTE == "NO_ROUTE"


# --- builders -------------------------------------------------------------------------------


def test_new_message_fills_identity_and_time() -> None:
    source, target = uuid4(), uuid4()
    one = new_message(MSG_COMMAND_REQUEST, source=source, target=target, details={"command": "x"})
    two = new_message(MSG_COMMAND_REQUEST, source=source, target=target, details={"command": "x"})
    assert one.message_id != two.message_id
    assert one.message_id.version == 4
    assert (one.source, one.target, one.reply_to) == (source, target, None)
    assert parse_timestamp(one.emitted_at).utcoffset() == timedelta(0)
    assert parse(serialize(one)) == one


def test_new_message_takes_a_payload_model_and_drops_its_empty_fields() -> None:
    message = new_message(
        MSG_COMMAND_RESULT, source=uuid4(), target=uuid4(), details=CommandResult(result=3)
    )
    assert message.details == {"result": 3}


def test_new_message_refuses_what_parse_would_refuse() -> None:
    with pytest.raises(InvalidMessage, match=r"^command_request: details.command: missing"):
        new_message(MSG_COMMAND_REQUEST, source=uuid4(), target=uuid4(), details={})
    with pytest.raises(InvalidMessage, match=r"^type: "):
        new_message("Not A Type", source=uuid4(), target=uuid4(), details={})
    with pytest.raises(InvalidMessage, match="NaN"):
        new_message("reading", source=uuid4(), target=uuid4(), details={"v": float("nan")})


def test_reply_swaps_source_and_target_and_points_back() -> None:
    request = parse(encode(envelope(source=ROOT, target=COORDINATOR, message_id=ID_A1B2)))
    result = request.reply(MSG_COMMAND_RESULT, CommandResult(command="analyze", result="ok"))
    assert result.source == UUID(COORDINATOR)
    assert result.target == UUID(ROOT)
    assert result.reply_to == request.message_id
    assert result.message_id not in (request.message_id, None)
    assert result.type == MSG_COMMAND_RESULT
    assert result.message_source == request.message_source
    assert result.details == {"command": "analyze", "result": "ok"}
    assert request.reply("note", {}, message_source="console").message_source == "console"


def test_acknowledgement_confirms_the_message_it_answers() -> None:
    job = parse(encode(envelope(source=SPECIALIST_A, target=COORDINATOR, message_id=ID_I9J0)))
    ack = job.acknowledgement()
    assert ack.type == MSG_ACKNOWLEDGED
    assert (ack.source, ack.target) == (job.target, job.source)
    assert ack.reply_to == job.message_id
    assert ack.details == {"in_response_to": ID_I9J0}
    assert ack.payload() == MessageAcknowledged(in_response_to=job.message_id)
    assert parse(serialize(ack)) == ack


@pytest.mark.parametrize("source", [None, "console", "client-7@example.com"])
def test_an_acknowledgement_reads_as_its_validated_build(source: str | None) -> None:
    # acknowledge() skips validating what was validated already: it must still be the
    # message the validating path builds, field for field, cache and serialization too.
    job = parse(encode(envelope(source=SPECIALIST_A, target=COORDINATOR, message_id=ID_I9J0)))
    ours = acknowledge(job, message_source=source)
    built = job.reply(
        MSG_ACKNOWLEDGED, MessageAcknowledged(in_response_to=job.message_id), message_source=source
    )
    fresh = {"message_id": built.message_id, "emitted_at": built.emitted_at}
    assert ours.model_copy(update=fresh) == built
    assert ours.model_fields_set == built.model_fields_set
    assert ours.payload() == built.payload()
    assert type(ours.details) is type(built.details)
    again = parse(serialize(ours))
    assert again == ours
    assert serialize(again) == serialize(ours)


def test_an_acknowledgement_with_a_bad_message_source_is_refused() -> None:
    job = parse(encode(envelope()))
    with pytest.raises(InvalidMessage, match="message_source"):
        acknowledge(job, message_source="")


def test_reply_refuses_an_invalid_payload() -> None:
    request = parse(encode(envelope()))
    with pytest.raises(InvalidMessage, match=r"^command_error: details.code: missing"):
        request.reply(MSG_COMMAND_ERROR, {"error": "boom"})


# --- the seed documents' own examples -------------------------------------------------------

# Seed 000, "Example Flow", steps 2, 4, 5 and 6, written in our canonical serialization.
# Step 2 elides message_source and emitted_at, which the envelope requires: filled in here.
SEED_000_STEP_2 = (
    f'{{"message_id":"{ID_A1B2}","message_source":"operator-console",'
    f'"emitted_at":"2026-01-11T08:00:00-03:00","source":"{ROOT}","target":"{COORDINATOR}",'
    '"type":"command_request","details":{"command":"analyze","params":{"target":"..."}}}'
)
SEED_000_STEP_4 = (
    f'{{"message_id":"{ID_E5F6}","message_source":"operator-console",'
    f'"emitted_at":"2026-01-11T08:00:00.250-03:00","source":"{COORDINATOR}",'
    f'"target":"{SPECIALIST_A}","type":"command_request",'
    f'"details":{{"command":"analyze","params":{{"target":"..."}}}},"reply_to":"{ID_A1B2}"}}'
)
SEED_000_STEP_5 = (
    f'{{"message_id":"{ID_I9J0}","message_source":"operator-console",'
    f'"emitted_at":"2026-01-11T08:00:03-03:00","source":"{SPECIALIST_A}",'
    f'"target":"{COORDINATOR}","type":"command_result","details":{{"result":"..."}},'
    f'"reply_to":"{ID_E5F6}"}}'
)
SEED_000_STEP_6 = (
    f'{{"message_id":"{ID_M3N4}","message_source":"operator-console",'
    f'"emitted_at":"2026-01-11T08:00:03.100-03:00","source":"{COORDINATOR}","target":"{ROOT}",'
    '"type":"command_result","details":{"command":"analyze","result":"...","summary":"..."},'
    f'"reply_to":"{ID_A1B2}"}}'
)
# Seed 003, "Example Flow": the specialist's job_detected, exactly as printed there.
SEED_003_JOB = (
    '{"message_id":"fa703dc8-0003-46f0-b4be-8dd0a5f398ac","message_source":"email address",'
    f'"emitted_at":"2026-01-11T08:00:00-03:00","source":"{SPECIALIST_A}",'
    f'"target":"{COORDINATOR}","type":"job_detected","details":{{'
    '"start_time":"2026-01-11T08:15:00-03:00","end_time":"2026-01-11T16:00:00-03:00",'
    '"estimated_effort_minutes":60,"price":{"currency":"USD","value":30},'
    '"note_to_human":"Client: Netwire\\nProject O-26-XXXXX-TRA-YYY"}}'
)
# Seed 003's acknowledgement as printed: it has no message_source.
SEED_003_ACK_AS_PRINTED = (
    '{"message_id":"a0f9e6f3-f611-4c55-940d-4cf72c624ad5",'
    f'"emitted_at":"2026-01-11T08:00:01-03:00","source":"{COORDINATOR}",'
    f'"target":"{SPECIALIST_A}","type":"message_acknowledged",'
    '"details":{"in_response_to":"fa703dc8-0003-46f0-b4be-8dd0a5f398ac"}}'
)
SEED_003_ACK = SEED_003_ACK_AS_PRINTED.replace(
    '"emitted_at"', '"message_source":"email address","emitted_at"'
)

SEED_EXAMPLES = {
    "000 step 2": SEED_000_STEP_2,
    "000 step 4": SEED_000_STEP_4,
    "000 step 5": SEED_000_STEP_5,
    "000 step 6": SEED_000_STEP_6,
    "003 job_detected": SEED_003_JOB,
    "003 acknowledgement": SEED_003_ACK,
}


@pytest.mark.parametrize("name", sorted(SEED_EXAMPLES))
def test_seed_examples_round_trip_byte_for_byte(name: str) -> None:
    data = SEED_EXAMPLES[name].encode()
    message = parse(data)
    assert serialize(message) == data
    assert parse(serialize(message)) == message
    assert message.payload() is not None


def test_seed_000_flow_links_through_reply_to() -> None:
    step2, step4, step5, step6 = (
        parse(SEED_EXAMPLES[f"000 step {n}"].encode()) for n in (2, 4, 5, 6)
    )
    # The coordinator delegates and answers the root for the root's own request.
    assert step4.reply_to == step2.message_id
    assert step5.reply_to == step4.message_id
    assert step6.reply_to == step2.message_id
    assert (step6.source, step6.target) == (step2.target, step2.source)
    assert step2.payload() == CommandRequest(command="analyze", params={"target": "..."})
    result = step6.payload()
    assert isinstance(result, CommandResult)
    assert (result.command, result.result, result.summary) == ("analyze", "...", "...")


def test_seed_003_job_detected_as_printed_in_the_seed() -> None:
    printed = f"""
    {{
      "message_id": "fa703dc8-0003-46f0-b4be-8dd0a5f398ac",
      "message_source": "email address",
      "emitted_at": "2026-01-11T08:00:00-03:00",
      "source": "{SPECIALIST_A}",
      "target": "{COORDINATOR}",
      "type": "job_detected",
      "details": {{
        "start_time": "2026-01-11T08:15:00-03:00",
        "end_time": "2026-01-11T16:00:00-03:00",
        "estimated_effort_minutes": 60,
        "price": {{ "currency": "USD", "value": 30 }},
        "note_to_human": "Client: Netwire\\nProject O-26-XXXXX-TRA-YYY"
      }}
    }}
    """
    message = parse(printed.encode())
    assert serialize(message) == SEED_003_JOB.encode()
    job = message.payload()
    assert isinstance(job, JobDetected)
    assert job.price.currency == "USD"
    assert job.price.value == 30
    assert job.estimated_effort_minutes == 60
    assert job.note_to_human == "Client: Netwire\nProject O-26-XXXXX-TRA-YYY"


def test_seed_003_acknowledgement_without_message_source_is_rejected() -> None:
    # Both seeds say every message MUST contain message_source; the printed ack omits it.
    assert reason_of(SEED_003_ACK_AS_PRINTED.encode()) == "message_source: missing (required)"
    ack = parse(SEED_003_ACK.encode())
    job = parse(SEED_003_JOB.encode())
    assert ack.payload() == MessageAcknowledged(in_response_to=job.message_id)
    assert (ack.source, ack.target) == (job.target, job.source)


def test_our_acknowledgement_of_the_seed_job_matches_the_seed_ack() -> None:
    job = parse(SEED_003_JOB.encode())
    ours = json.loads(serialize(job.acknowledgement()))
    theirs = json.loads(SEED_003_ACK)
    for field in ("message_source", "source", "target", "type", "details"):
        assert ours[field] == theirs[field]
    # We also set reply_to, which the seed's ack leaves out (it is optional).
    assert ours["reply_to"] == str(job.message_id)
    assert isinstance(parse(serialize(job.acknowledgement())), VOXMessage)


def test_a_payload_view_cannot_change_its_message() -> None:
    # The typed view is cached and shared: changing it would change the message for every
    # later reader, the runner's delegated request included (seed 003: immutable).
    message = new_message(
        MSG_COMMAND_REQUEST,
        source=uuid4(),
        target=uuid4(),
        details={"command": "x", "params": {"a": 1, "nested": {"b": [1]}}},
    )
    payload = message.payload_as(CommandRequest)
    with pytest.raises(TypeError):
        payload.params["injected"] = 1
    with pytest.raises(TypeError):
        payload.params["nested"]["b"].append(2)
    assert message.payload_as(CommandRequest).params == {"a": 1, "nested": {"b": [1]}}
    assert serialize(message) == serialize(parse(serialize(message)))


def test_now_iso_is_the_clock_to_the_millisecond_and_never_goes_back() -> None:
    # now_iso keeps the last millisecond's text (protocol/messages.py): it must still follow
    # the clock, in the one form every row and message carries.
    seen: list[str] = []
    give_up = time.monotonic() + 5.0
    while len(set(seen)) < 5 and time.monotonic() < give_up:  # a few milliseconds' worth
        before = datetime.now(UTC)
        text = now_iso()
        after = datetime.now(UTC)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", text)
        millisecond = before.replace(microsecond=before.microsecond // 1000 * 1000)
        assert millisecond <= datetime.fromisoformat(text) <= after
        seen.append(text)
    assert len(set(seen)) == 5, "now_iso did not follow the clock"
    assert seen == sorted(seen)


@pytest.mark.parametrize("value", ["2026-01-11T08:00:00", "yesterday"])
def test_a_refused_timestamp_is_refused_every_time(value: str) -> None:
    # parse_timestamp keeps what it parsed; what it refused is refused again, not kept.
    for _ in range(2):
        with pytest.raises(ValueError, match=r"ISO-8601|no timezone"):
            parse_timestamp(value)
