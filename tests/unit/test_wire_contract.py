"""What the project relies on in each MQTT library, one contract each: a release that changes
any of it fails here, before anything runs over a broker (docs/transport.md, "The wire")."""

from __future__ import annotations

import inspect

import aiomqtt
import mqtt5
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.transport.packets import frame_publish
from vox_mqtt.transport.publishprops import MessageProperties

# mqtt5: the codec under transport/wire.py


def test_mqtt5_reads_one_packet_and_says_how_long_it_was() -> None:
    packet = mqtt5.PingRespPacket().write()
    read, size = mqtt5.read(memoryview(packet + b"\xd0"))  # and the start of another
    assert isinstance(read, mqtt5.PingRespPacket)
    assert size == len(packet)


def test_mqtt5_says_a_packet_cut_short_with_index_error() -> None:
    packet = mqtt5.SubAckPacket(7, [mqtt5.SubAckReasonCode.GRANTED_QOS_AT_LEAST_ONCE]).write()
    with pytest.raises(IndexError):
        mqtt5.read(memoryview(packet[:-1]))


def test_mqtt5_reads_the_publish_the_wire_frames() -> None:
    props = MessageProperties(
        content_type="application/json",
        message_expiry_interval=30,
        user_properties=(("vox-type", "command_request"),),
    )
    packet = frame_publish("vox/a/inbox/b", b"{}", 1, True, 513, props.pack())
    read, size = mqtt5.read(memoryview(packet))
    assert size == len(packet)
    assert isinstance(read, mqtt5.PublishPacket)
    assert (read.topic, read.payload, read.packet_id, read.retain, int(read.qos)) == (
        "vox/a/inbox/b",
        b"{}",
        513,
        True,
        1,
    )
    assert read.content_type == "application/json"
    assert read.user_properties == [("vox-type", "command_request")]
    assert read.message_expiry_interval == 30


def test_mqtt5_writes_the_connect_the_session_needs() -> None:
    will = mqtt5.Will(
        "vox/a/status",
        payload=b"{}",
        qos=mqtt5.QoS.AT_LEAST_ONCE,
        retain=True,
        payload_format_indicator=1,
        message_expiry_interval=60,
        content_type="application/json",
        user_properties=[("vox-sig", "x")],
    )
    connect = mqtt5.ConnectPacket(
        "agent-1",
        username="agent-1",
        password=b"secret",
        clean_start=False,
        will=will,
        keep_alive=30,
        session_expiry_interval=3600,
        receive_max=100,
    )
    read, _ = mqtt5.read(memoryview(connect.write()))
    assert isinstance(read, mqtt5.ConnectPacket)
    assert (read.client_id, read.username, read.password) == ("agent-1", "agent-1", b"secret")
    assert (read.clean_start, read.keep_alive) == (False, 30)
    assert (read.session_expiry_interval, read.receive_max) == (3600, 100)
    assert read.will is not None
    assert (read.will.topic, read.will.payload, read.will.retain) == ("vox/a/status", b"{}", True)
    assert read.will.user_properties == [("vox-sig", "x")]
    assert read.will.message_expiry_interval == 60


def test_mqtt5_writes_subscriptions_with_their_options() -> None:
    filters = [
        mqtt5.TopicFilter(
            "vox/+/status",
            max_qos=mqtt5.QoS.AT_LEAST_ONCE,
            retain_as_published=False,
            retain_handling=mqtt5.RetainHandling.SEND_NEVER,
        )
    ]
    read, _ = mqtt5.read(memoryview(mqtt5.SubscribePacket(9, filters).write()))
    assert isinstance(read, mqtt5.SubscribePacket)
    (got,) = read.topic_filters
    assert (got.pattern, int(got.max_qos), got.retain_as_published) == ("vox/+/status", 1, False)
    assert got.retain_handling == mqtt5.RetainHandling.SEND_NEVER
    unsubscribe, _ = mqtt5.read(memoryview(mqtt5.UnsubscribePacket(10, ["a/#"]).write()))
    assert isinstance(unsubscribe, mqtt5.UnsubscribePacket)


def test_mqtt5_reads_the_broker_s_answers_as_the_wire_does() -> None:
    connack = mqtt5.ConnAckPacket(
        session_present=True, reason_code=mqtt5.ConnAckReasonCode.NOT_AUTHORIZED
    )
    read, _ = mqtt5.read(memoryview(connack.write()))
    assert isinstance(read, mqtt5.ConnAckPacket)
    assert (read.session_present, int(read.reason_code)) == (True, 0x87)
    suback = mqtt5.SubAckPacket(3, [mqtt5.SubAckReasonCode.NOT_AUTHORIZED])
    read, _ = mqtt5.read(memoryview(suback.write()))
    assert isinstance(read, mqtt5.SubAckPacket)
    assert (read.packet_id, [int(c) for c in read.reason_codes]) == (3, [0x87])
    disconnect = mqtt5.DisconnectPacket(reason_code=mqtt5.DisconnectReasonCode.SESSION_TAKEN_OVER)
    read, _ = mqtt5.read(memoryview(disconnect.write()))
    assert isinstance(read, mqtt5.DisconnectPacket)
    assert int(read.reason_code) == 0x8E
    assert mqtt5.DisconnectPacket().write() == b"\xe0\x00"
    assert mqtt5.PingReqPacket().write() == b"\xc0\x00"


def test_mqtt5_names_reason_codes_from_their_values() -> None:
    assert mqtt5.PubAckReasonCode(0x87).name == "NOT_AUTHORIZED"
    assert mqtt5.ConnAckReasonCode(0x86).name == "BAD_USER_NAME_OR_PASSWORD"
    assert mqtt5.DisconnectReasonCode(0x8E).name == "SESSION_TAKEN_OVER"
    with pytest.raises(ValueError, match="Invalid"):  # what reason_name falls back on
        mqtt5.PubAckReasonCode(0x01)


# paho: no longer under vox_mqtt (publishprops.py packs and decodes PUBLISH properties
# itself); its Properties are the independent witness the suite holds them to
# (tests/unit/test_publishprops.py, test_signing_bytes.py), its client the raw test clients.


def test_paho_properties_pack_and_unpack_as_the_witness_uses_them() -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    props.PayloadFormatIndicator = 1
    props.UserProperty = [("vox-type", "status"), ("vox-from", "alpha")]
    props.MessageExpiryInterval = 30
    packed = props.pack()  # type: ignore[no-untyped-call]
    assert isinstance(packed, bytes)
    again = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    again.unpack(packed)  # type: ignore[no-untyped-call]
    assert again.UserProperty == [("vox-type", "status"), ("vox-from", "alpha")]
    assert (again.ContentType, again.MessageExpiryInterval) == ("application/json", 30)


# aiomqtt: the raw baselines of bench/ and the suite's raw witnesses


def test_aiomqtt_client_takes_what_the_baselines_pass() -> None:
    parameters = inspect.signature(aiomqtt.Client).parameters
    for name in ("username", "password", "identifier", "protocol", "socket_options", "will"):
        assert name in parameters, name
    assert issubclass(aiomqtt.MqttError, Exception)
    assert aiomqtt.ProtocolVersion.V5
