"""The packets of the hot path, framed and cut by hand (transport/wire.py uses them).

A PUBLISH is framed around properties packed once per kind (transport/publishprops.py);
a PUBACK is four bytes; a packet is cut from the read buffer only once it is whole. Every
other packet goes through the `mqtt5` codec.
"""

from __future__ import annotations

import struct
from typing import Final

import mqtt5

from vox_mqtt.protocol.messages import MAX_PACKET_BYTES

__all__ = [
    "MalformedPacket",
    "frame_publish",
    "puback",
    "reason_name",
    "reason_name_connack",
    "split_packet",
    "utf8",
    "varint",
]


class MalformedPacket(Exception):
    """Bytes from the broker that are not a packet this client reads: the transport's one
    protocol error (the connection ends with "protocol error"; docs/transport.md)."""


_PUBLISH: Final = 0x30


def reason_name(code: int) -> str:
    """Return a reason code's name in words ("Not authorized") for messages and outcomes."""
    name = _NAMES.get(code)
    if name is None:
        try:
            raw = mqtt5.PubAckReasonCode(code).name
        except ValueError:
            try:
                raw = mqtt5.DisconnectReasonCode(code).name
            except ValueError:
                raw = f"REASON_{code:02X}"
        name = _NAMES[code] = raw.replace("_", " ").capitalize()
    return name


_NAMES: dict[int, str] = {0x80: "Unspecified error"}


def varint(value: int) -> bytes:
    """Return value as an MQTT variable byte integer (MQTT v5 1.5.5)."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def utf8(text: str) -> bytes:
    """Return text as an MQTT UTF-8 string: its length in two bytes, then the bytes."""
    encoded = text.encode()
    return struct.pack("!H", len(encoded)) + encoded


def frame_publish(
    topic: str, payload: bytes, qos: int, retain: bool, mid: int, packed_properties: bytes
) -> bytes:
    """Return one MQTT v5 PUBLISH packet (3.3) with properties already packed (length first)."""
    head = utf8(topic)
    if qos:
        head += struct.pack("!H", mid)
    size = len(head) + len(packed_properties) + len(payload)
    first = _PUBLISH | (qos << 1) | (1 if retain else 0)
    return b"".join((bytes((first,)), varint(size), head, packed_properties, payload))


def puback(mid: int) -> bytes:
    """Return the PUBACK of a received QoS 1 message (success, no properties)."""
    return b"\x40\x02" + struct.pack("!H", mid)


def split_packet(
    buffer: bytearray | memoryview, max_size: int = MAX_PACKET_BYTES
) -> tuple[int, int, int] | None:
    """Return (first byte, body start, body end) of the packet buffer starts with, or None.

    A packet declared longer than max_size (the Maximum Packet Size this client sends in
    its CONNECT, MQTT v5 3.1.2.11.4) is refused as soon as its length is read, before its
    bytes arrive: what a connection buffers stays within one packet of that size.
    """
    size, shift, at = 0, 0, 1
    while True:
        if at >= len(buffer):
            return None
        byte = buffer[at]
        at += 1
        size |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 21:
            raise MalformedPacket("a remaining length longer than 4 bytes")
    end = at + size
    if end > max_size:
        raise MalformedPacket(f"a packet of {end} bytes, above the {max_size} this client takes")
    if end > len(buffer):
        return None
    return buffer[0], at, end


def reason_name_connack(code: int) -> str:
    """Return a CONNACK reason code's name in words ("Not authorized")."""
    try:
        return mqtt5.ConnAckReasonCode(code).name.replace("_", " ").capitalize()
    except ValueError:
        return f"Reason 0x{code:02X}"
