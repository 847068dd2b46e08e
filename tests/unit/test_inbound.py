"""Inbound's properties are the transport's own values, packed as received or decoded."""

from __future__ import annotations

from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.inbound import Inbound, carried
from vox_mqtt.transport.publishprops import MessageProperties

PROPS = MessageProperties(
    content_type="application/json",
    message_expiry_interval=30,
    user_properties=(("vox-type", "status"), ("vox-sig", "old"), ("vox-sig", "new")),
)


def test_packed_and_decoded_properties_read_the_same() -> None:
    packed = carried(RawProperties(PROPS.pack()))
    decoded = carried(PROPS)
    assert isinstance(packed, bytes)  # left packed: decoded only when read
    assert isinstance(decoded, dict)  # plain values under Inbound's keys
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
    assert carried(MessageProperties()) == {}
    assert Inbound(topic="t", payload=b"", retain=False, wire_properties=b"\x00").properties == {}


def test_properties_that_do_not_parse_read_as_none() -> None:
    for broken in (b"", b"\x05\x26\x00\x01", b"\x03\x23\x00\x01", b"\x02\x01\x07"):
        inbound = Inbound(topic="t", payload=b"", retain=False, wire_properties=broken)
        assert inbound.properties == {}
        assert inbound.user_property("vox-sig") is None
