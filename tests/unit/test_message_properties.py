"""Property tests: whatever arrives, parse() returns a message or raises InvalidMessage."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.messages import PAYLOAD_MODELS, VOXMessage, new_message, parse, serialize

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ENVELOPE_KEYS = [
    "message_id",
    "message_source",
    "emitted_at",
    "source",
    "target",
    "type",
    "details",
    "reply_to",
]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)
uuid_texts = st.uuids().map(str)
offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
aware_times = st.builds(
    lambda moment, tz: moment.replace(tzinfo=UTC).astimezone(tz).isoformat(),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    offsets,
)
# Mostly valid-looking values, sometimes something else entirely.
message_types = st.sampled_from(sorted(PAYLOAD_MODELS)) | st.from_regex(
    r"[a-z][a-z0-9_.]{0,20}", fullmatch=True
)
valid_envelopes = st.fixed_dictionaries(
    {
        "message_id": uuid_texts,
        "message_source": st.text(min_size=1, max_size=20),
        "emitted_at": aware_times,
        "source": uuid_texts,
        "target": uuid_texts,
        "type": message_types,
        "details": json_objects,
    },
    optional={"reply_to": uuid_texts},
)
_REMOVE = object()


def _spoil(fields: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    spoiled = dict(fields)
    if value is _REMOVE:
        spoiled.pop(key, None)
    else:
        spoiled[key] = value
    return spoiled


# A valid envelope with one field replaced by anything, removed, or one field added.
spoiled_envelopes = st.builds(
    _spoil,
    valid_envelopes,
    st.sampled_from([*ENVELOPE_KEYS, "extra"]),
    json_values | st.just(_REMOVE) | st.text(max_size=40),
)
envelopes = valid_envelopes | spoiled_envelopes


def parse_or_refuse(data: bytes) -> VOXMessage | None:
    """Parse, allowing only InvalidMessage (anything else fails the test)."""
    reason = ""
    try:
        message = parse(data)
    except InvalidMessage as exc:
        reason = exc.reason
        message = None
    if message is None:
        assert reason.strip(), "an InvalidMessage must say why"
        return None
    # Whatever parses, re-serializes to a fixed point and back to an equal message.
    again = parse(serialize(message))
    assert again == message
    assert serialize(again) == serialize(message)
    return message


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_ever_raise_invalid_message(data: bytes) -> None:
    parse_or_refuse(data)


@FUZZ
@given(json_values)
def test_arbitrary_json_only_ever_parses_or_raises_invalid_message(value: Any) -> None:
    parse_or_refuse(json.dumps(value).encode())


@FUZZ
@given(
    st.dictionaries(st.sampled_from(ENVELOPE_KEYS) | st.text(max_size=8), json_values, max_size=9)
)
def test_objects_with_envelope_keys_only_parse_or_raise_invalid_message(
    fields: dict[str, Any],
) -> None:
    parse_or_refuse(json.dumps(fields).encode())


@FUZZ
@given(envelopes)
def test_valid_looking_envelopes_only_parse_or_raise_invalid_message(
    fields: dict[str, Any],
) -> None:
    message = parse_or_refuse(json.dumps(fields).encode())
    if message is not None:
        assert message.message_id == UUID(fields["message_id"])
        assert message.details == fields["details"]


@FUZZ
@given(valid_envelopes)
def test_valid_envelopes_of_unknown_types_always_parse(fields: dict[str, Any]) -> None:
    message = parse_or_refuse(json.dumps(fields).encode())
    if fields["type"] not in PAYLOAD_MODELS:
        assert message is not None
        assert message.payload() is None
        assert message.details == fields["details"]


@FUZZ
@given(envelopes, st.data())
def test_corrupted_messages_only_parse_or_raise_invalid_message(
    fields: dict[str, Any], data: st.DataObject
) -> None:
    raw = bytearray(json.dumps(fields).encode())
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if action == "flip":
            raw[at] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
        elif action == "drop":
            del raw[at]
        else:
            raw.insert(at, data.draw(st.integers(min_value=0, max_value=255)))
    parse_or_refuse(bytes(raw))


@FUZZ
@given(st.uuids(), st.uuids(), st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True), json_objects)
def test_built_messages_round_trip(source: UUID, target: UUID, type: str, details: Any) -> None:
    try:
        message = new_message(type, source=source, target=target, details=details)
    except InvalidMessage:
        # A known type with random details: refused, as parse would refuse it.
        assert type in PAYLOAD_MODELS
        return
    assert parse(serialize(message)) == message
    assert serialize(parse(serialize(message))) == serialize(message)
    reply = message.reply("note", {"echo": details})
    assert parse(serialize(reply)).reply_to == message.message_id
