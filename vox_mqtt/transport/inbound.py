"""One message as a subscription delivers it, with the verdict on its signature."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from paho.mqtt.exception import MalformedPacket
from paho.mqtt.properties import Properties

from vox_mqtt.transport._mqttdecode import RawProperties

__all__ = ["Inbound"]

_INBOUND = {  # paho property name -> Inbound.properties key
    "ContentType": "content_type",
    "MessageExpiryInterval": "message_expiry_interval",
    "UserProperty": "user_properties",
}


@dataclass(frozen=True, kw_only=True)
class Inbound:
    """One message received on a subscription."""

    topic: str
    payload: bytes
    retain: bool
    # Left packed as received: no agent reads them, and decoding costs more than the rest of
    # the PUBLISH (see _mqttdecode.py).
    raw_properties: RawProperties | Properties | None = None
    # The message's `vox-sig` as received, and why it may not be believed (None: it may,
    # or signatures are off); set by the session before anyone sees it (docs/security.md).
    signature: str | None = None
    forgery: str | None = None
    digest: bytes | None = field(default=None, repr=False)  # SHA-256 of the payload, if checked

    @functools.cached_property
    def properties(self) -> dict[str, Any]:
        """Return content_type, message_expiry_interval (seconds left), user_properties."""
        raw = self.raw_properties
        if isinstance(raw, RawProperties):
            try:
                raw = raw.decode()
            except MalformedPacket:
                # Properties that do not parse tell nothing: read as a message without any
                # (the broker checks them first; this guards a broker that does not).
                return {}
        return {k: getattr(raw, n) for n, k in _INBOUND.items() if hasattr(raw, n)}
