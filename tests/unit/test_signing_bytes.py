"""The bytes a signature travels in: base64url as the standard library makes it, and the
packed user property appended to a kind's properties, kept per kind, equal to one packed
afresh."""

from __future__ import annotations

import base64
from uuid import uuid4

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.signing import Keyring, SigningKey, check, sign
from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.publishprops import (
    PublishProperties,
    signature_of,
    vox_properties,
    with_user_property,
)

SENDER, TARGET = uuid4(), uuid4()
KEY = SigningKey.generate()
TOPIC = topics.inbox(TARGET, SENDER)
RING = Keyring(current={SENDER: {KEY.kid: KEY.public}})


def test_the_signature_is_base64url_unpadded_as_the_standard_library_writes_it() -> None:
    for n in range(20):
        payload = b'{"n":%d}' % n
        kid, _, text = sign(TOPIC, payload, KEY).partition(".")
        raw = base64.urlsafe_b64decode(text + "==")
        assert base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == text
        assert (kid, len(raw)) == (KEY.kid, 64)
        assert check(TOPIC, payload, f"{kid}.{text}", RING) is None


def test_a_signature_in_another_alphabet_or_not_ascii_is_malformed_or_bad() -> None:
    payload = b"{}"
    kid, _, text = sign(TOPIC, payload, KEY).partition(".")
    standard = text.replace("-", "+").replace("_", "/")  # base64, not base64url: still decodes
    assert check(TOPIC, payload, f"{kid}.{standard}", RING) is None
    for broken in (text[:-1] + "é", text[:-1] + "\x00"):
        problem = check(TOPIC, payload, f"{kid}.{broken}", RING)
        assert problem is not None
        assert problem.split(":")[0] in {"MALFORMED_SIGNATURE", "BAD_SIGNATURE"}


def decoded(packed: bytes) -> dict[str, object]:
    """Return what paho reads in packed properties."""
    return dict(RawProperties(packed).decode().json())  # type: ignore[no-untyped-call]


def fresh(props: Properties, key: str, value: str) -> dict[str, object]:
    """Return what props plus one user property read as, made the slow way (paho's own)."""
    made = decoded(props.pack())  # type: ignore[no-untyped-call]
    made["UserProperty"] = [*made.get("UserProperty", []), (key, value)]  # type: ignore[misc]
    return made


def test_the_appended_property_kept_per_kind_is_the_one_packed_afresh() -> None:
    kinds = PublishProperties("alpha", {TARGET: "beta"})
    props = kinds.inbox(TARGET, "command_request")
    values = [sign(TOPIC, b'{"n":%d}' % n, KEY) for n in range(3)] + ["short", "é" * 3]
    for value in values * 2:  # the second time from what was kept
        made = with_user_property(props, "vox-sig", value).pack()  # type: ignore[no-untyped-call]
        assert decoded(made) == fresh(props, "vox-sig", value)
        assert signature_of(made, "vox-sig") == value
    assert props.pack() == kinds.inbox(TARGET, "command_request").pack()  # type: ignore[no-untyped-call]


def test_properties_never_packed_keep_nothing_and_follow_their_changes() -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [("vox-type", "command_request")]
    first = with_user_property(props, "vox-sig", "x" * 10).pack()  # type: ignore[no-untyped-call]
    props.UserProperty = [("vox-type", "command_result")]
    second = with_user_property(props, "vox-sig", "x" * 10).pack()  # type: ignore[no-untyped-call]
    assert first != second
    assert decoded(second) == fresh(props, "vox-sig", "x" * 10)
    expiring = vox_properties(type="status", sender="alpha", expiry=30)
    made = with_user_property(expiring, "vox-sig", "v").pack()  # type: ignore[no-untyped-call]
    assert decoded(made) == fresh(expiring, "vox-sig", "v")
