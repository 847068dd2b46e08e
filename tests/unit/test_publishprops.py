"""The publish properties (vox_mqtt/transport/publishprops.py, docs/transport.md): every
PUBLISH property packed and read back, packed byte for byte as paho packs them (an
independent witness, here only), any bytes decoded or refused with the transport's one
error, and the kinds an agent caches with a deadline's expiry spliced in."""

from __future__ import annotations

import dataclasses
from uuid import uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.kits.propskit import message_properties
from vox_mqtt.transport.packets import MalformedPacket
from vox_mqtt.transport.publishprops import (
    MessageProperties,
    PackedProperties,
    PublishProperties,
    decode,
    publish_properties,
    vox_properties,
)


def paho_packed(props: MessageProperties) -> bytes:
    """Return props as paho packs them: the witness our packing is held to."""
    theirs = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    names = {
        "payload_format_indicator": "PayloadFormatIndicator",
        "message_expiry_interval": "MessageExpiryInterval",
        "content_type": "ContentType",
        "response_topic": "ResponseTopic",
        "correlation_data": "CorrelationData",
        "subscription_identifiers": "SubscriptionIdentifier",
        "user_properties": "UserProperty",
    }
    for field, name in names.items():
        value = getattr(props, field)
        if isinstance(value, tuple):
            if value:
                setattr(theirs, name, list(value))
        elif value is not None:
            setattr(theirs, name, value)
    packed: bytes = theirs.pack()  # type: ignore[no-untyped-call]
    return packed


def paho_read(packed: bytes) -> dict[str, object]:
    """Return what paho reads in packed properties."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.unpack(packed)  # type: ignore[no-untyped-call]
    return dict(props.json())  # type: ignore[no-untyped-call]


@given(props=message_properties())
def test_every_property_reads_back_as_packed(props: MessageProperties) -> None:
    packed = props.packed()
    assert isinstance(packed, PackedProperties)
    assert decode(packed.packed) == props
    assert packed.decode() == props


@given(props=message_properties())
def test_the_properties_are_packed_byte_for_byte_as_paho_packs_them(
    props: MessageProperties,
) -> None:
    assert props.pack() == paho_packed(props)


def test_each_property_alone_reads_back() -> None:
    every = MessageProperties(
        payload_format_indicator=1,
        message_expiry_interval=2**32 - 1,
        content_type="application/json",
        response_topic="vox/a/inbox/b",
        correlation_data=b"\x00\xff",
        subscription_identifiers=(1, 268_435_455),
        user_properties=(("vox-type", "status"), ("vox-sig", "a"), ("vox-sig", "b")),
    )
    for field in dataclasses.fields(MessageProperties):
        alone = MessageProperties(**{field.name: getattr(every, field.name)})
        assert decode(alone.pack()) == alone, field.name
    assert decode(every.pack()) == every
    assert decode(b"\x00") == MessageProperties()


@pytest.mark.parametrize(
    ("props", "why"),
    [
        (MessageProperties(payload_format_indicator=2), "0 or 1"),
        (MessageProperties(message_expiry_interval=2**32), "four-byte"),
        (MessageProperties(message_expiry_interval=-1), "four-byte"),
        (MessageProperties(content_type="a\x00b"), "U\\+0000"),
        (MessageProperties(response_topic="vox/+/inbox"), "wildcard"),
        (MessageProperties(correlation_data=b"x" * 65_536), "65,535 bytes"),
        (MessageProperties(subscription_identifiers=(0,)), "subscription identifier"),
        (MessageProperties(user_properties=(("k", "\ud800"),)), "surrogates"),
        (MessageProperties(user_properties=(("k", "x" * 65_536),)), "65,535 bytes"),
    ],
)
def test_a_value_mqtt_does_not_allow_is_not_packed(props: MessageProperties, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        props.pack()


@pytest.mark.parametrize(
    ("packed", "why"),
    [
        (b"", "cut short"),
        (b"\x80", "cut short"),
        (b"\xff\xff\xff\xff\x01", "longer than 4 bytes"),
        (b"\x02\x01", "announced"),  # two announced, one sent
        (b"\x01\x01\x00", "announced"),  # one announced, two sent
        (b"\x01\x01", "cut short"),  # a payload format indicator without its byte
        (b"\x02\x01\x02", "indicator of 2"),
        (b"\x04\x01\x01\x01\x00", "twice"),
        (b"\x03\x02\x00\x00", "cut short"),  # an expiry of two bytes
        (b"\x03\x23\x00\x01", "0x23"),  # a topic alias: none allowed (MessageProperties)
        (b"\x03\x11\x00\x00", "0x11"),  # a session expiry: a CONNECT property
        (b"\x02\x81\x01", "0x81"),  # an identifier in two bytes: none is a PUBLISH one
        (b"\x02\x03\x00", "cut short"),
        (b"\x04\x03\x00\x05a", "past the end"),
        (b"\x04\x03\x00\x01\xff", "not UTF-8"),
        (b"\x05\x03\x00\x02\xed\xa0", "not UTF-8"),  # cut inside an encoded surrogate
        (b"\x04\x03\x00\x01\x00", "U\\+0000"),
        (b"\x04\x08\x00\x01#", "wildcard"),
        (b"\x02\x0b\x00", "identifier of 0"),
        (b"\x02\x0b\x80", "cut short"),
        (b"\x06\x26\x00\x01k\x00\x05", "past the end"),
    ],
)
def test_malformed_properties_are_refused_with_the_transport_s_error(
    packed: bytes, why: str
) -> None:
    with pytest.raises(MalformedPacket, match=why):
        decode(packed)


@settings(max_examples=500)
@given(body=st.binary(max_size=80), data=st.data())
def test_any_bytes_decode_or_raise_only_malformed_packet(body: bytes, data: st.DataObject) -> None:
    """Garbage outright, and garbage behind a length that counts it: decoded or refused,
    never another error; what decodes is PUBLISH properties paho reads the same."""
    for packed in (body, bytes([len(body)]) + body if len(body) < 128 else body):
        try:
            got = decode(packed)
        except MalformedPacket:
            continue
        assert decode(got.pack()) == got
        strings = [
            got.content_type,
            got.response_topic,
            *(s for p in got.user_properties for s in p),
        ]
        if not any("\ufeff" in s for s in strings if s):  # paho refuses U+FEFF, MQTT v5 allows
            assert paho_read(got.pack()) == paho_read(packed)


@given(props=message_properties(), data=st.data())
def test_well_formed_properties_cut_or_corrupted_are_refused_or_read(
    props: MessageProperties, data: st.DataObject
) -> None:
    packed = props.pack()
    cut = data.draw(st.integers(0, len(packed) - 1))
    with pytest.raises(MalformedPacket):
        decode(packed[:cut])  # the length no longer counts the bytes
    at = data.draw(st.integers(0, len(packed) - 1))
    corrupted = packed[:at] + bytes([data.draw(st.integers(0, 255))]) + packed[at + 1 :]
    try:
        got = decode(corrupted)
    except MalformedPacket:
        return
    assert decode(got.pack()) == got


def test_the_shared_kinds_are_packed_once() -> None:
    assert publish_properties("application/json", 30) is publish_properties("application/json", 30)
    assert decode(publish_properties("application/json", 30).packed) == MessageProperties(
        content_type="application/json", message_expiry_interval=30
    )
    assert publish_properties(None, None).packed == b"\x00"


NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,30}", fullmatch=True)


@given(expiry=st.integers(min_value=0, max_value=2**32 - 1), name=NAMES)
def test_an_expiry_spliced_in_reads_as_paho_packs_it(expiry: int, name: str) -> None:
    target = uuid4()
    kinds = PublishProperties("operator", {target: name})
    spliced = kinds.inbox(target, "command_request", expiry=expiry).packed
    built = vox_properties(type="command_request", sender="operator", target=name, expiry=expiry)
    assert paho_read(spliced) == paho_read(built.packed)
    assert decode(spliced) == decode(built.packed)
    assert decode(spliced).message_expiry_interval == expiry


def test_the_cached_kind_is_not_changed_by_an_expiry() -> None:
    target = uuid4()
    kinds = PublishProperties("operator", {target: "root"})
    plain = kinds.inbox(target, "command_request").packed
    kinds.inbox(target, "command_request", expiry=30)
    assert kinds.inbox(target, "command_request").packed == plain
    assert decode(plain).message_expiry_interval is None


def test_a_vox_publish_says_what_it_is_and_who_sends_it() -> None:
    props = decode(vox_properties(type="status", sender="alpha", target="beta").packed)
    assert props == MessageProperties(
        payload_format_indicator=1,
        content_type="application/json",
        user_properties=(("vox-type", "status"), ("vox-from", "alpha"), ("vox-to", "beta")),
    )
