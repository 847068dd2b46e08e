"""The lean PUBLISH decoding (vox_mqtt/transport/_mqttdecode.py) reads every packet as paho does."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt import _packet
from paho.mqtt.client import MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.transport._mqttdecode import RawProperties, decode_lean, puback_code, split_publish
from vox_mqtt.transport.inbound import Inbound

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
QOS1 = 0x32  # PUBLISH, QoS 1


@st.composite
def publish_properties(draw: st.DrawFn) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    if draw(st.booleans()):
        props.PayloadFormatIndicator = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        props.MessageExpiryInterval = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        props.ContentType = draw(text)
    if draw(st.booleans()):
        props.ResponseTopic = draw(text.filter(bool))
    if draw(st.booleans()):
        props.CorrelationData = draw(st.binary(max_size=40))
    pairs = draw(st.lists(st.tuples(text, text), max_size=5))
    if pairs:
        props.UserProperty = pairs
    return props


def publish_body(topic: bytes, mid: int, props: Properties, payload: bytes) -> bytes:
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", mid) + props.pack() + payload


def as_dict(props: Properties) -> dict[str, Any]:
    return {name: getattr(props, name) for name in props.names if hasattr(props, name)}


@given(
    topic=st.binary(min_size=1, max_size=200),
    mid=st.integers(1, 65535),
    props=publish_properties(),
    payload=st.binary(max_size=300),
)
def test_a_publish_splits_as_paho_decodes_it(
    topic: bytes, mid: int, props: Properties, payload: bytes
) -> None:
    body = publish_body(topic, mid, props, payload)
    paho = _packet.decode_publish(QOS1, body, MQTTProtocolVersion.MQTTv5)
    got_topic, got_mid, packed, got_payload = split_publish(bytearray(body))
    assert (got_topic, got_mid, got_payload) == (paho.topic, paho.mid, paho.payload)
    assert paho.properties is not None
    assert as_dict(RawProperties(packed).decode()) == as_dict(paho.properties)


@given(props=publish_properties(), payload=st.binary(max_size=50), data=st.data())
def test_a_cut_publish_is_a_malformed_packet_never_another_error(
    props: Properties, payload: bytes, data: st.DataObject
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
def test_malformed_publishes_are_refused_with_paho_s_error(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        split_publish(body)


def test_puback_codes_are_shared_and_named_as_paho_names_them() -> None:
    assert puback_code(0x87) is puback_code(0x87)
    assert puback_code(0x87).getName() == "Not authorized"
    assert puback_code(0).value == 0


@pytest.mark.parametrize("header", [0x32, 0x33, 0x3A])  # QoS 1; retained; a duplicate
def test_a_received_message_reads_as_paho_s_own(header: int) -> None:
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "application/json"
    props.UserProperty = [("vox-type", "command_request")]
    body = publish_body(b"vox/a/inbox/b", 4242, props, b'{"n": 1}')

    def receive(lean: bool) -> mqtt.MQTTMessage:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.manual_ack_set(True)  # no socket here to send a PUBACK on
        got: list[mqtt.MQTTMessage] = []
        client.on_message = lambda _client, _userdata, message: got.append(message)
        if lean:
            decode_lean(client)
        client._in_packet = {"command": header, "packet": bytearray(body)}
        client._handle_publish()
        return got[0]

    paho, ours = receive(lean=False), receive(lean=True)
    for name in ("topic", "mid", "qos", "retain", "dup", "payload", "state"):
        assert getattr(ours, name) == getattr(paho, name), name
    assert isinstance(ours.properties, RawProperties)
    assert paho.properties is not None
    assert as_dict(ours.properties.decode()) == as_dict(paho.properties)
