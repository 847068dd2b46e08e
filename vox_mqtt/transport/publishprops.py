"""The MQTT v5 properties of VOX publishes: what an MQTT explorer shows beside a message.

Every VOX publish says it is UTF-8 JSON (payload-format indicator 1, content type) and
carries user properties a person can read without opening the payload: the message type
(`vox-type`), the sender's name (`vox-from`) and, on an inbox topic, the target's name
(`vox-to`). Only names both peers already know travel: an inbox message names its sender
and target (master and child know each other); a status or war-room post, read by more
than its sender's peers, names only its sender (docs/topics.md).

The properties are the transport's own (docs/transport.md, "PUBLISH properties"):
`MessageProperties` holds their values, is packed once per kind of publish into a
`PackedProperties`, which the connection frames as they are, and `decode` reads packed
properties back, raising the transport's one protocol error (packets.MalformedPacket) on
anything that is not PUBLISH properties. No MQTT library is involved either way.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from uuid import UUID

from vox_mqtt.transport.packets import MalformedPacket, utf8, varint

__all__ = [
    "CONTENT_TYPE",
    "FROM_KEY",
    "TO_KEY",
    "TYPE_KEY",
    "MessageProperties",
    "PackedProperties",
    "PublishProperties",
    "decode",
    "packed_bytes",
    "publish_properties",
    "signature_of",
    "vox_properties",
    "with_expiry",
    "with_user_property",
]

CONTENT_TYPE: Final = "application/json"
TYPE_KEY: Final = "vox-type"
FROM_KEY: Final = "vox-from"
TO_KEY: Final = "vox-to"
_UTF8: Final = 1  # payload-format indicator: the payload is UTF-8 text

# The identifiers of the PUBLISH properties (MQTT v5 3.3.2.3), in the order they are packed.
_FORMAT: Final = 0x01  # payload format indicator, one byte: 0 or 1
_EXPIRY: Final = 0x02  # message expiry interval, a four-byte integer
_CONTENT_TYPE: Final = 0x03  # a UTF-8 string
_RESPONSE_TOPIC: Final = 0x08  # a UTF-8 string, no wildcard
_CORRELATION: Final = 0x09  # binary data
_SUBSCRIPTION_ID: Final = 0x0B  # a variable byte integer, 1 and up; may repeat
_USER_PROPERTY: Final = 0x26  # a UTF-8 string pair; may repeat
_MAX_VARINT: Final = 268_435_455  # the largest variable byte integer (MQTT v5 1.5.5)


@dataclass(frozen=True, slots=True)
class MessageProperties:
    """The properties of one PUBLISH (MQTT v5 3.3.2.3) as plain values; None: absent.

    Built once per kind of publish and packed once (`packed`); `decode` makes one from
    received bytes. A Topic Alias is not among them: this client allows the broker none
    (Topic Alias Maximum 0), so one received is a protocol error. Subscription identifiers
    are read only: the broker adds them to what it delivers, a client never sends them
    (MQTT v5 3.3.4), and this client subscribes without any.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    user_properties: tuple[tuple[str, str], ...] = ()

    def pack(self) -> bytes:
        """Return the properties as they go on the wire: their length first, then each in
        the order of its identifier (the order paho packs them in, byte for byte).

        Raise ValueError for a value MQTT v5 does not allow: what this packs, `decode`
        reads back as it was.
        """
        out = bytearray()
        if self.payload_format_indicator is not None:
            if self.payload_format_indicator not in (0, 1):
                raise ValueError("the payload format indicator is 0 or 1")
            out += bytes((_FORMAT, self.payload_format_indicator))
        if self.message_expiry_interval is not None:
            out.append(_EXPIRY)
            out += _four_bytes(self.message_expiry_interval, "message expiry interval")
        if self.content_type is not None:
            out.append(_CONTENT_TYPE)
            out += _string(self.content_type)
        if self.response_topic is not None:
            if "+" in self.response_topic or "#" in self.response_topic:
                raise ValueError("a response topic has no wildcard (MQTT v5 3.3.2.3.5)")
            out.append(_RESPONSE_TOPIC)
            out += _string(self.response_topic)
        if self.correlation_data is not None:
            out.append(_CORRELATION)
            out += _binary(self.correlation_data)
        for number in self.subscription_identifiers:
            if not 1 <= number <= _MAX_VARINT:
                raise ValueError(f"a subscription identifier is 1 to {_MAX_VARINT}")
            out.append(_SUBSCRIPTION_ID)
            out += varint(number)
        for key, value in self.user_properties:
            out.append(_USER_PROPERTY)
            out += _string(key)
            out += _string(value)
        if len(out) > _MAX_VARINT:
            raise ValueError("properties longer than a variable byte integer counts")
        return varint(len(out)) + bytes(out)

    def packed(self) -> PackedProperties:
        """Return these properties packed, once: what a publish of their kind sends."""
        return PackedProperties(self.pack())


def _four_bytes(value: int, what: str) -> bytes:
    if not 0 <= value <= 0xFFFF_FFFF:
        raise ValueError(f"the {what} is a four-byte integer, not {value}")
    return value.to_bytes(4, "big")


def _string(text: str) -> bytes:
    """Return text as an MQTT UTF-8 string (packets.utf8), refusing what MQTT v5 1.5.4 does."""
    if "\x00" in text:
        raise ValueError("an MQTT string has no U+0000 (MQTT v5 1.5.4)")
    try:
        return utf8(text)  # UnicodeEncodeError (a ValueError) for a lone surrogate
    except struct.error:  # its length does not fit in two bytes
        raise ValueError("an MQTT string is at most 65,535 bytes") from None


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("MQTT binary data is at most 65,535 bytes")
    return len(data).to_bytes(2, "big") + data


class PackedProperties:
    """PUBLISH properties as they go on the wire (length first), packed once and never
    changed after: one object serves every publish of its kind, and the connection frames
    its bytes as they are (packets.frame_publish)."""

    __slots__ = ("_heads", "packed")

    def __init__(self, packed: bytes) -> None:
        self.packed = packed
        # What with_user_property keeps per (key, value length): everything but the value.
        self._heads: dict[tuple[str, int], bytes] | None = None

    def decode(self) -> MessageProperties:
        """Return the values of these properties (MalformedPacket if they are none)."""
        return decode(self.packed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackedProperties) and other.packed == self.packed

    def __hash__(self) -> int:
        return hash(self.packed)

    def __repr__(self) -> str:
        return f"<{len(self.packed)} bytes of packed properties>"


def decode(packed: bytes) -> MessageProperties:
    """Return the PUBLISH properties packed (length first, as a PUBLISH carries them).

    Raise MalformedPacket for anything else (MQTT v5 2.2.2, 3.3.2.3, 1.5): a length that
    is not the bytes' own, an identifier that is no PUBLISH property's (a Topic Alias
    included, see MessageProperties), a value cut short, one given twice that may not be,
    a payload format indicator other than 0 or 1, a subscription identifier of 0, a string
    that is not UTF-8 or holds U+0000, a response topic with a wildcard. Each step reads
    at least one byte: any input ends.
    """
    end = len(packed)
    length, at = _read_varint(packed, 0, end, "the property length")
    if at + length != end:
        raise MalformedPacket(f"PUBLISH: {length} bytes of properties announced, {end - at} sent")
    fmt: int | None = None
    expiry: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    subscriptions: list[int] = []
    pairs: list[tuple[str, str]] = []
    while at < end:
        ident = packed[at]
        at += 1
        if ident == _USER_PROPERTY:  # the most frequent first: three per VOX message
            key, at = _read_string(packed, at, end)
            value, at = _read_string(packed, at, end)
            pairs.append((key, value))
        elif ident == _CONTENT_TYPE:
            _once(content_type, "content type")
            content_type, at = _read_string(packed, at, end)
        elif ident == _FORMAT:
            _once(fmt, "payload format indicator")
            if at >= end:
                raise MalformedPacket("PUBLISH: the payload format indicator is cut short")
            fmt = packed[at]
            at += 1
            if fmt > 1:
                raise MalformedPacket(f"PUBLISH: a payload format indicator of {fmt}")
        elif ident == _EXPIRY:
            _once(expiry, "message expiry interval")
            if at + 4 > end:
                raise MalformedPacket("PUBLISH: the message expiry interval is cut short")
            expiry = int.from_bytes(packed[at : at + 4], "big")
            at += 4
        elif ident == _RESPONSE_TOPIC:
            _once(response_topic, "response topic")
            response_topic, at = _read_string(packed, at, end)
            if "+" in response_topic or "#" in response_topic:
                raise MalformedPacket("PUBLISH: a response topic with a wildcard")
        elif ident == _CORRELATION:
            _once(correlation, "correlation data")
            size, at = _read_size(packed, at, end)
            correlation = packed[at - size : at]
        elif ident == _SUBSCRIPTION_ID:
            number, at = _read_varint(packed, at, end, "a subscription identifier")
            if number == 0:
                raise MalformedPacket("PUBLISH: a subscription identifier of 0")
            subscriptions.append(number)
        else:
            raise MalformedPacket(f"PUBLISH: property 0x{ident:02X} is no PUBLISH property")
    return MessageProperties(
        payload_format_indicator=fmt,
        message_expiry_interval=expiry,
        content_type=content_type,
        response_topic=response_topic,
        correlation_data=correlation,
        subscription_identifiers=tuple(subscriptions),
        user_properties=tuple(pairs),
    )


def _once(value: object, name: str) -> None:
    if value is not None:
        raise MalformedPacket(f"PUBLISH: the {name} given twice")


def _read_varint(data: bytes, at: int, end: int, what: str) -> tuple[int, int]:
    """Return (value, offset after it) of a variable byte integer of at most 4 bytes."""
    value = shift = 0
    while True:
        if at >= end:
            raise MalformedPacket(f"PUBLISH: {what} is cut short")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 21:
            raise MalformedPacket(f"PUBLISH: {what} longer than 4 bytes")


def _read_size(data: bytes, at: int, end: int) -> tuple[int, int]:
    """Return (n, offset after the n bytes) of a two-byte length and the n bytes it counts."""
    if at + 2 > end:
        raise MalformedPacket("PUBLISH: a property's length is cut short")
    size = (data[at] << 8) | data[at + 1]
    at += 2 + size
    if at > end:
        raise MalformedPacket("PUBLISH: a property runs past the end of the properties")
    return size, at


def _read_string(data: bytes, at: int, end: int) -> tuple[str, int]:
    """Return (text, offset after it) of an MQTT UTF-8 string (_read_size's, inlined: most
    of what decode reads is strings)."""
    start = at + 2
    if start > end:
        raise MalformedPacket("PUBLISH: a property's length is cut short")
    at = start + ((data[at] << 8) | data[at + 1])
    if at > end:
        raise MalformedPacket("PUBLISH: a property runs past the end of the properties")
    try:
        text = data[start:at].decode()
    except UnicodeDecodeError:
        raise MalformedPacket("PUBLISH: a property string that is not UTF-8") from None
    if "\x00" in text:
        raise MalformedPacket("PUBLISH: a property string holding U+0000")
    return text, at


@functools.lru_cache(maxsize=512)
def publish_properties(content_type: str | None, expiry: int | None) -> PackedProperties:
    """Return the (shared, never changed) PUBLISH properties for one kind of publish."""
    return MessageProperties(content_type=content_type, message_expiry_interval=expiry).packed()


def packed_bytes(props: PackedProperties) -> bytes:
    """Return props as they go on the wire (length first): what the connection frames."""
    return props.packed


def vox_properties(
    *, type: str, sender: str, target: str | None = None, expiry: int | None = None
) -> PackedProperties:
    """Return the properties of one VOX publish, packed."""
    pairs = [(TYPE_KEY, type), (FROM_KEY, sender)]
    if target:
        pairs.append((TO_KEY, target))
    return MessageProperties(
        payload_format_indicator=_UTF8,
        message_expiry_interval=expiry,
        content_type=CONTENT_TYPE,
        user_properties=tuple(pairs),
    ).packed()


class PublishProperties:
    """One agent's publish properties, built once per (peer, type) and reused: a hop builds none.

    Properties are read, never changed, once built, so one object serves every publish of
    its kind, packed once.
    """

    def __init__(self, name: str, peers: Mapping[UUID, str]) -> None:
        self.name = name
        self.peers = dict(peers)
        self._inbox: dict[tuple[UUID, str], PackedProperties] = {}
        self._own: dict[tuple[str, int | None], PackedProperties] = {}

    def inbox(self, target: UUID, type: str, *, expiry: int | None = None) -> PackedProperties:
        """Return the properties of a message to a peer's inbox."""
        key = (target, type)
        props = self._inbox.get(key)
        if props is None:
            props = self._inbox[key] = vox_properties(
                type=type, sender=self.name, target=self.peers.get(target)
            )
        # A deadline's expiry differs per message: spliced into the kind's packed bytes
        # rather than built and packed again.
        return props if expiry is None else with_expiry(props, expiry)

    def own(self, type: str, *, expiry: int | None = None) -> PackedProperties:
        """Return the properties of a status or war-room post: the sender's name only."""
        key = (type, expiry)
        props = self._own.get(key)
        if props is None:
            props = self._own[key] = vox_properties(type=type, sender=self.name, expiry=expiry)
        return props

    def will(self, type: str) -> tuple[tuple[str, str], ...]:
        """Return the user properties of the will (a status): the sender's name only."""
        return ((TYPE_KEY, type), (FROM_KEY, self.name))


def _skip_varint(data: bytes) -> int:
    """Return the offset after the variable byte integer data starts with."""
    at = 0
    while data[at] & 0x80:
        at += 1
    return at + 1


def with_user_property(props: PackedProperties, key: str, value: str) -> PackedProperties:
    """Return props with one more user property, last (props is not changed).

    Appended to the packed bytes rather than built and packed again: a signature differs
    per message. Everything but the value is kept with props, per key and value length (a
    signature's is always the same): one concatenation per publish.
    """
    encoded = value.encode()
    heads = props._heads
    if heads is None:
        heads = props._heads = {}
    head = heads.get((key, len(encoded)))
    if head is None:
        old = props.packed
        body = old[_skip_varint(old) :] + bytes([_USER_PROPERTY]) + utf8(key)
        body += len(encoded).to_bytes(2, "big")
        head = heads[(key, len(encoded))] = varint(len(body) + len(encoded)) + body
    return PackedProperties(head + encoded)


def with_expiry(props: PackedProperties, expiry: int) -> PackedProperties:
    """Return props with a message expiry interval, first (props is not changed)."""
    old = props.packed
    body = bytes([_EXPIRY]) + expiry.to_bytes(4, "big") + old[_skip_varint(old) :]
    return PackedProperties(varint(len(body)) + body)


_markers: dict[str, bytes] = {}  # a user property's key as packed, per key


def signature_of(packed_props: bytes, key: str) -> str | None:
    """Return the value of the last user property `key` in packed properties; None if absent.

    A plain search: the signature is the last property a signer appends, and whatever a
    forger puts before it can only name a signature that must still verify (docs/security.md).
    """
    marker = _markers.get(key)
    if marker is None:
        marker = _markers[key] = bytes([_USER_PROPERTY]) + utf8(key)
    at = packed_props.rfind(marker)
    if at < 0:
        return None
    at += len(marker)
    size = int.from_bytes(packed_props[at : at + 2], "big")
    raw = packed_props[at + 2 : at + 2 + size]
    if len(raw) != size:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None
