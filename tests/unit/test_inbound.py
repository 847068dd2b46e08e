"""Inbound's properties are the transport's own values, however the message was decoded."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.inbound import Inbound, carried


def paho_properties() -> Properties:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    props.MessageExpiryInterval = 30
    props.UserProperty = [("vox-type", "status"), ("vox-sig", "old"), ("vox-sig", "new")]
    return props


def test_packed_and_decoded_properties_read_the_same() -> None:
    props = paho_properties()
    packed = carried(RawProperties(props.pack()))  # type: ignore[no-untyped-call]
    decoded = carried(props)
    assert isinstance(packed, bytes)  # left packed: decoded only when read
    assert isinstance(decoded, dict)  # paho's object left behind, its values kept
    for wire in (packed, decoded):
        inbound = Inbound(topic="t", payload=b"", retain=False, wire_properties=wire)
        assert inbound.properties == {
            "content_type": "application/json",
            "message_expiry_interval": 30,
            "user_properties": [("vox-type", "status"), ("vox-sig", "old"), ("vox-sig", "new")],
        }
        assert inbound.user_property("vox-sig") == "new"  # the last one, as the signer appends
        assert inbound.user_property("vox-to") is None


def test_a_message_without_properties_has_none() -> None:
    assert carried(None) is None
    inbound = Inbound(topic="t", payload=b"", retain=False)
    assert inbound.properties == {}
    assert inbound.user_property("vox-sig") is None
    empty = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    assert carried(empty) == {}
