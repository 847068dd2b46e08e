"""The MQTT v5 properties of VOX publishes: what an MQTT explorer shows beside a message.

Every VOX publish says it is UTF-8 JSON (payload-format indicator 1, content type) and
carries user properties a person can read without opening the payload: the message type
(`vox-type`), the sender's name (`vox-from`) and, on an inbox topic, the target's name
(`vox-to`). Only names both peers already know travel: an inbox message names its sender
and target (master and child know each other); a status or war-room post, read by more
than its sender's peers, names only its sender (docs/topics.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final
from uuid import UUID

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.transport.packets import utf8, varint

__all__ = [
    "CONTENT_TYPE",
    "FROM_KEY",
    "TO_KEY",
    "TYPE_KEY",
    "PackedProperties",
    "PublishProperties",
    "packed",
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
_USER_PROPERTY: Final = 0x26  # its identifier in a packed property list (MQTT v5 2.2.2.2)
_EXPIRY: Final = 0x02  # message expiry interval, a four-byte integer


class PackedProperties(Properties):
    """Properties serialized once by `packed`: paho would pack them again for every publish."""

    def pack(self) -> bytes:
        """Return the serialized properties (packed once, as they never change after)."""
        known: bytes | None = self.__dict__.get("_packed")
        if known is None:
            known = Properties.pack(self)  # type: ignore[no-untyped-call]
        return known


def packed(props: PackedProperties) -> PackedProperties:
    """Serialize props now and keep the bytes: they must not be changed afterwards."""
    props.__dict__["_packed"] = Properties.pack(props)  # type: ignore[no-untyped-call]
    return props


@functools.lru_cache(maxsize=512)
def publish_properties(content_type: str | None, expiry: int | None) -> Properties:
    """Return the (shared, never modified) PUBLISH properties for one kind of publish."""
    result = PackedProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if content_type is not None:
        result.ContentType = content_type
    if expiry is not None:
        result.MessageExpiryInterval = expiry
    return packed(result)


def packed_bytes(props: Properties) -> bytes:
    """Return props as they go on the wire (length first): what the connection frames."""
    data: bytes = props.pack()  # type: ignore[no-untyped-call]
    return data


def vox_properties(
    *,
    type: str,
    sender: str,
    target: str | None = None,
    expiry: int | None = None,
    packet: int = PacketTypes.PUBLISH,
) -> Properties:
    """Return the properties of one VOX publish (or will, with packet=WILLMESSAGE)."""
    props = PackedProperties(packet)  # type: ignore[no-untyped-call]
    props.ContentType = CONTENT_TYPE
    props.PayloadFormatIndicator = _UTF8
    pairs = [(TYPE_KEY, type), (FROM_KEY, sender)]
    if target:
        pairs.append((TO_KEY, target))
    props.UserProperty = pairs
    if expiry is not None:
        props.MessageExpiryInterval = expiry
    return packed(props)


class PublishProperties:
    """One agent's publish properties, built once per (peer, type) and reused: a hop builds none.

    Properties are read, never changed, once built, so one object serves every publish of
    its kind (paho packs them as it sends).
    """

    def __init__(self, name: str, peers: Mapping[UUID, str]) -> None:
        self.name = name
        self.peers = dict(peers)
        self._inbox: dict[tuple[UUID, str], Properties] = {}
        self._own: dict[tuple[str, int | None], Properties] = {}

    def inbox(self, target: UUID, type: str, *, expiry: int | None = None) -> Properties:
        """Return the properties of a message to a peer's inbox."""
        key = (target, type)
        props = self._inbox.get(key)
        if props is None:
            props = self._inbox[key] = vox_properties(
                type=type, sender=self.name, target=self.peers.get(target)
            )
        # A deadline's expiry differs per message: spliced into the kind's packed bytes
        # rather than built and packed again (paho's setters and pack cost more than the
        # rest of the publish).
        return props if expiry is None else with_expiry(props, expiry)

    def own(self, type: str, *, expiry: int | None = None) -> Properties:
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


def with_user_property(props: Properties, key: str, value: str) -> Properties:
    """Return props with one more user property, packed at once (props is not changed).

    Appended to the packed bytes rather than rebuilt: a signature differs per message, and
    paho would otherwise pack every property again (see PackedProperties). Everything but
    the value is kept with props, per key and value length (a signature's is always the
    same): one concatenation per publish.
    """
    encoded = value.encode()
    heads: dict[tuple[str, int], bytes] | None = props.__dict__.get("_heads")
    head = None if heads is None else heads.get((key, len(encoded)))
    if head is None:
        packed_old: bytes = props.pack()  # type: ignore[no-untyped-call]
        body = packed_old[_skip_varint(packed_old) :] + bytes([_USER_PROPERTY]) + utf8(key)
        body += len(encoded).to_bytes(2, "big")
        head = varint(len(body) + len(encoded)) + body
        if "_packed" in props.__dict__:  # packed once, never changed after: kept with them
            props.__dict__.setdefault("_heads", {})[(key, len(encoded))] = head
    return _Appended(head + encoded)


class _Appended(PackedProperties):
    """Packed properties made from bytes alone, once per signed publish or deadline's expiry.

    paho's own __init__ builds its tables of every property name for each object (most of
    with_user_property's time, measured); paho only ever asks a publish's properties to
    pack(), which returns these bytes.
    """

    def __init__(self, packed: bytes) -> None:  # paho's __init__ skipped on purpose
        self.__dict__.update(packetType=PacketTypes.PUBLISH, _packed=packed)

    def __str__(self) -> str:
        return f"<{len(self.__dict__['_packed'])} bytes of packed properties>"


def with_expiry(props: Properties, expiry: int) -> Properties:
    """Return props with a message expiry interval, packed at once (props is not changed)."""
    packed_old: bytes = props.pack()  # type: ignore[no-untyped-call]
    body = bytes([_EXPIRY]) + expiry.to_bytes(4, "big") + packed_old[_skip_varint(packed_old) :]
    return _Appended(varint(len(body)) + body)


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
