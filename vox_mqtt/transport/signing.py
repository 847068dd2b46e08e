"""What the session does with signatures: sign each publish and will, judge each delivery.

The decisions are protocol/signing.py's; this module only finds the `vox-sig` property in
the properties received and appends it to the packed properties sent (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vox_mqtt.protocol.settings import Will
from vox_mqtt.protocol.signing import SIG_KEY, Signing, check, payload_digest, sign
from vox_mqtt.transport.inbound import Carried
from vox_mqtt.transport.publishprops import PackedProperties, signature_of, with_user_property

__all__ = ["Verdict", "judge", "own_key_renewed", "signed_properties", "signed_will"]

_LINK_PREFIX = "vox/link/"


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 3 times as much
class Verdict:
    """What a received message's signature says."""

    signature: str | None
    forgery: str | None  # why it may not be believed; None: it may
    digest: bytes
    unsigned: bool  # unsigned and let through ("accept" mode)


def signed_properties(
    signing: Signing | None, topic: str, payload: bytes, props: PackedProperties
) -> PackedProperties:
    """Return props with this identity's signature of (topic, payload), when it signs."""
    if signing is None or signing.key is None or signing.mode == "off":
        return props
    return with_user_property(props, SIG_KEY, sign(topic, payload, signing.key))


def signed_will(signing: Signing | None, will: Will | None) -> Will | None:
    """Return the will with its signature: the broker may publish it long after."""
    if will is None or signing is None or signing.key is None or signing.mode == "off":
        return will
    value = sign(will.topic, will.payload, signing.key)
    return replace(will, user_properties=(*will.user_properties, (SIG_KEY, value)))


def own_key_renewed(old: Signing | None, new: Signing | None) -> bool:
    """Tell whether new signs with another own key than old (a rotation of this identity)."""
    return _own_kid(old) != _own_kid(new)


def _own_kid(signing: Signing | None) -> str | None:
    if signing is None or signing.key is None or not signing.signs:
        return None
    return signing.key.kid


def received_signature(raw: Carried) -> str | None:
    """Return the `vox-sig` of received properties, packed or decoded (inbound.carried)."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        return signature_of(raw, SIG_KEY)
    pairs = raw.get("user_properties") or ()
    return next((value for key, value in reversed(pairs) if key == SIG_KEY), None)


def judge(signing: Signing, topic: str, payload: bytes, raw: Carried) -> Verdict:
    """Return the verdict on one received message under signing's mode (not "off")."""
    value = received_signature(raw)
    digest = payload_digest(payload)
    if value is None and signing.mode == "accept":
        return Verdict(None, None, digest, unsigned=not topic.startswith(_LINK_PREFIX))
    forgery = check(topic, payload, value, signing.keyring, digest=digest)
    return Verdict(value, forgery, digest, unsigned=False)
