"""The lean PUBLISH decoding (vox_mqtt/transport/_mqttdecode.py, transport/wire.py) reads every
packet as the `mqtt5` codec does, and what the connection frames reads back as sent."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import mqtt5
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kits.propskit import message_properties
from vox_mqtt.protocol.messages import MAX_PACKET_BYTES
from vox_mqtt.transport._mqttdecode import RawProperties, split_publish
from vox_mqtt.transport.inbound import Inbound
from vox_mqtt.transport.packets import MalformedPacket, frame_publish, reason_name, split_packet
from vox_mqtt.transport.publishprops import MessageProperties
from vox_mqtt.transport.wire import Connection, Received

QOS1 = 0x32  # PUBLISH, QoS 1
SENT_PROPERTIES = message_properties(subscriptions=False)  # as a client sends them


def publish_body(topic: bytes, mid: int, props: MessageProperties, payload: bytes) -> bytes:
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", mid) + props.pack() + payload


# What mqtt5 calls each property (the same names as ours).
_MQTT5_NAMES = (
    "payload_format_indicator",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
)
topics = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00+#"), min_size=1)


@given(
    topic=topics.filter(lambda t: len(t.encode()) < 200),
    mid=st.integers(1, 65535),
    props=SENT_PROPERTIES,
    payload=st.binary(max_size=300),
)
def test_a_publish_splits_as_mqtt5_reads_it(
    topic: str, mid: int, props: MessageProperties, payload: bytes
) -> None:
    packet = frame_publish(topic, payload, 1, False, mid, props.pack())
    theirs, size = mqtt5.read(memoryview(packet))
    assert size == len(packet)
    assert isinstance(theirs, mqtt5.PublishPacket)
    body = publish_body(topic.encode(), mid, props, payload)
    got_topic, got_mid, packed, got_payload = split_publish(bytearray(body))
    assert (got_topic.decode(), got_mid, got_payload) == (
        theirs.topic,
        theirs.packet_id,
        theirs.payload,
    )
    decoded = RawProperties(packed).decode()
    for name in _MQTT5_NAMES:
        value = getattr(theirs, name)
        ours = getattr(decoded, name)
        if name == "user_properties":
            assert list(ours) == value
        elif name == "payload_format_indicator":
            assert (ours or 0) == value
        else:  # mqtt5 reads an absent string or binary as empty
            assert (ours or None) == (value or None), name


@given(props=SENT_PROPERTIES, payload=st.binary(max_size=50), data=st.data())
def test_a_cut_publish_is_a_malformed_packet_never_another_error(
    props: MessageProperties, payload: bytes, data: st.DataObject
) -> None:
    body = publish_body(b"vox/a/inbox/b", 7, props, payload)
    cut = data.draw(st.integers(0, len(body)))
    try:
        split_publish(body[:cut])
    except MalformedPacket:
        # Cut anywhere before the payload, the packet must be refused.
        assert cut < len(body) - len(payload)


@given(
    topic=st.binary(max_size=20),
    packed=st.binary(max_size=60),
    payload=st.binary(max_size=20),
    noise=st.binary(max_size=80),
)
def test_any_bytes_are_a_publish_or_a_malformed_packet_never_another_error(
    topic: bytes, packed: bytes, payload: bytes, noise: bytes
) -> None:
    # Garbage outright, and garbage where the properties go behind a well-formed header:
    # unknown identifiers, values cut short, a property of another packet, bad UTF-8.
    framed = struct.pack("!H", len(topic)) + topic + struct.pack("!H", 1)
    framed += bytes([len(packed)]) + packed + payload if len(packed) < 128 else b""
    for body in (noise, framed):
        try:
            got_topic, _mid, props, got_payload = split_publish(body)
        except MalformedPacket:
            continue
        assert len(got_topic) + len(props) + len(got_payload) <= len(body)
        with contextlib.suppress(MalformedPacket):
            RawProperties(props).decode()
        # Inbound reads such properties as none at all, and raises nothing.
        inbound = Inbound(topic="t", payload=got_payload, retain=False, wire_properties=props)
        assert isinstance(inbound.properties, dict)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00",
        b"\x00\x05abc",  # a topic longer than the packet
        b"\x00\x01a\x00",  # no packet id
        b"\x00\x01a\x00\x01\xff\xff\xff\xff\x01",  # a property length of five bytes
        b"\x00\x01a\x00\x01\x10\x01",  # 16 bytes of properties announced, one there
    ],
)
def test_malformed_publishes_are_refused_with_the_transport_s_error(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        split_publish(body)


def test_reason_codes_are_named_in_words() -> None:
    assert reason_name(0x87) == "Not authorized"
    assert reason_name(0x10) == "No matching subscribers"
    assert reason_name(0x8E) == "Session taken over"
    assert reason_name(0xFE) == "Reason fe"  # no such code: still a name, never an error


@pytest.mark.parametrize(("qos", "retain"), [(1, False), (1, True), (0, False)])
async def test_a_received_message_reads_as_sent(qos: int, retain: bool) -> None:
    props = MessageProperties(
        content_type="application/json", user_properties=(("vox-type", "command_request"),)
    )
    got: list[Received] = []
    connection = Connection("c", keepalive=30)
    connection.sink = lambda message: got.append(message) is None
    packet = frame_publish("vox/a/inbox/b", b'{"n": 1}', qos, retain, 4242, props.pack())
    connection.data_received(packet[:5])  # a packet in two reads
    assert got == []
    connection.data_received(packet[5:])
    (message,) = got
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "vox/a/inbox/b",
        b'{"n": 1}',
        qos,
        retain,
    )
    assert message.mid == (4242 if qos else 0)
    assert message.properties is not None
    assert message.properties.decode() == props


def test_a_packet_is_cut_only_once_it_is_all_there() -> None:
    packet = frame_publish("t", b"x" * 200, 1, False, 1, b"\x00")  # a two-byte length
    assert packet[1] & 0x80
    for cut in range(len(packet)):
        assert split_packet(bytearray(packet[:cut])) is None
    first, start, end = split_packet(bytearray(packet + b"\xc0\x00")) or (0, 0, 0)
    assert (first, start, end) == (packet[0], 3, len(packet))
    with pytest.raises(MalformedPacket):
        split_packet(bytearray(b"\x30\xff\xff\xff\xff\x01"))  # a length of five bytes


def test_a_packet_longer_than_the_client_takes_is_refused_before_it_arrives() -> None:
    header = frame_publish("t", b"x" * (MAX_PACKET_BYTES + 1), 1, False, 1, b"\x00")[:5]
    with pytest.raises(MalformedPacket, match="above the"):
        split_packet(bytearray(header))  # only the fixed header is there yet
    exact = frame_publish("t", b"x" * 10, 1, False, 1, b"\x00")
    assert split_packet(bytearray(exact), max_size=len(exact)) is not None
    with pytest.raises(MalformedPacket):
        split_packet(bytearray(exact), max_size=len(exact) - 1)


@settings(max_examples=300)
@given(chunks=st.lists(st.binary(max_size=300), max_size=12), big=st.booleans())
def test_any_bytes_from_a_broker_end_the_connection_or_read_never_a_crash(
    chunks: list[bytes], big: bool
) -> None:
    """Arbitrary bytes into a connection: nothing raises out of data_received, a protocol
    error ends it, and what it buffers stays within one packet of the size it takes."""

    async def feed() -> Connection:
        connection = Connection("c", keepalive=0)
        connection.sink = lambda message: True
        if big:  # a declared length far beyond the maximum, then its bytes keep coming
            connection.data_received(b"\x30\xff\xff\xff\x7f")
        for chunk in chunks:
            connection.data_received(chunk)
            assert len(connection.buffered) <= MAX_PACKET_BYTES + len(chunk)
        return connection

    connection = asyncio.run(feed())
    if big:
        assert connection.buffered == b""
