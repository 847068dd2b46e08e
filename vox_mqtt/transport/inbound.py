"""One message as a subscription delivers it, with the verdict on its signature.

Its MQTT v5 properties are the transport's own plain values: the packed bytes as received,
or the few already decoded (publishprops.MessageProperties), under our names. No object of
an MQTT library leaves vox_mqtt/transport/ (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.packets import MalformedPacket
from vox_mqtt.transport.publishprops import MessageProperties, decode

__all__ = ["Carried", "Inbound", "carried"]

# What a message carries of its properties: packed as received (length first, decoded only
# on demand), or already decoded, under Inbound.properties' keys.
Carried = bytes | Mapping[str, Any] | None


def carried(received: RawProperties | MessageProperties | None) -> Carried:
    """Return the properties of a received message as Inbound carries them.

    A PUBLISH the connection cut (_mqttdecode.py) keeps them packed; decoded ones give
    their few values under our keys.
    """
    if received is None:
        return None
    if isinstance(received, RawProperties):
        return received.packed
    return _named(received)


def _named(decoded: MessageProperties) -> dict[str, Any]:
    named: dict[str, Any] = {}
    if decoded.content_type is not None:
        named["content_type"] = decoded.content_type
    if decoded.message_expiry_interval is not None:
        named["message_expiry_interval"] = decoded.message_expiry_interval
    if decoded.user_properties:
        named["user_properties"] = list(decoded.user_properties)
    return named


@dataclass(frozen=True, kw_only=True)
class Inbound:
    """One message received on a subscription."""

    topic: str
    payload: bytes
    retain: bool
    # Left packed as received: no agent reads them, and decoding costs more than the rest of
    # the PUBLISH (see _mqttdecode.py). Read them through `properties`.
    wire_properties: Carried = field(default=None, repr=False)
    # The message's `vox-sig` as received, and why it may not be believed (None: it may,
    # or signatures are off); set by the session before anyone sees it (docs/security.md).
    signature: str | None = None
    forgery: str | None = None
    digest: bytes | None = field(default=None, repr=False)  # SHA-256 of the payload, if checked

    @functools.cached_property
    def properties(self) -> dict[str, Any]:
        """Return content_type, message_expiry_interval (seconds left), user_properties."""
        raw = self.wire_properties
        if raw is None:
            return {}
        if not isinstance(raw, bytes):
            return dict(raw)
        try:
            decoded = decode(raw)
        except MalformedPacket:
            # Properties that do not parse tell nothing: read as a message without any
            # (the broker checks them first; this guards a broker that does not).
            return {}
        return _named(decoded)

    def user_property(self, key: str) -> str | None:
        """Return the last value of one MQTT v5 user property, None when it is absent."""
        pairs = self.properties.get("user_properties") or ()
        return next((value for name, value in reversed(pairs) if name == key), None)
