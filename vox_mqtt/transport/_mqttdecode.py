"""A received PUBLISH cut into its parts, its properties left packed until someone asks.

Unpacking every PUBLISH's properties (the content type, expiry and three user properties
each VOX message carries) costs more than the rest of the packet, and no agent reads them:
they stay packed (RawProperties) and are decoded, by publishprops.decode, on demand.
The connection (transport/wire.py) cuts each PUBLISH with split_publish.
"""

from __future__ import annotations

import struct

from vox_mqtt.transport.packets import MalformedPacket
from vox_mqtt.transport.publishprops import MessageProperties, decode

__all__ = ["RawProperties", "split_publish"]


class RawProperties:
    """A received PUBLISH's v5 properties as packed (length first): decoded only on demand."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes) -> None:
        self.packed = packed

    def decode(self) -> MessageProperties:
        """Return the properties' values; MalformedPacket if they do not parse, the error
        split_publish raises too (tests/unit/test_mqtt_decode.py fuzzes both)."""
        return decode(self.packed)


def split_publish(
    packet: bytes | bytearray, *, with_id: bool = True
) -> tuple[bytes, int, bytes, bytes]:
    """Cut an MQTT v5 PUBLISH body into (topic, packet id, packed properties, payload).

    with_id: the packet has a packet id (QoS 1 and 2); without one (QoS 0) it reads as 0.
    """
    try:
        (topic_length,) = struct.unpack_from("!H", packet, 0)
        at = 2 + topic_length
        if at + (2 if with_id else 1) > len(packet):
            raise MalformedPacket("PUBLISH: the topic runs past the end of the packet")
        topic = bytes(packet[2:at])
        mid = 0
        if with_id:
            (mid,) = struct.unpack_from("!H", packet, at)
            at += 2
        start, length, shift = at, 0, 0
        while True:  # the property length: a variable byte integer of at most 4 bytes
            byte = packet[at]
            at += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 21:
                raise MalformedPacket("PUBLISH: a property length longer than 4 bytes")
    except (struct.error, IndexError):
        raise MalformedPacket("PUBLISH: the packet ends inside its header") from None
    end = at + length
    if end > len(packet):
        raise MalformedPacket("PUBLISH: the properties run past the end of the packet")
    return topic, mid, bytes(packet[start:end]), bytes(packet[end:])
