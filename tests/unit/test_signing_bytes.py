"""The bytes a signature travels in: base64url as the standard library makes it, and the
packed user property appended to a kind's properties, kept per kind, equal to one packed
afresh."""

from __future__ import annotations

import base64
import dataclasses
from uuid import uuid4

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.signing import Keyring, SigningKey, check, sign
from vox_mqtt.transport.publishprops import (
    MessageProperties,
    PackedProperties,
    PublishProperties,
    decode,
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


def fresh(props: PackedProperties, key: str, value: str) -> bytes:
    """Return props plus one user property, last, decoded and packed afresh."""
    made = decode(props.packed)
    pairs = (*made.user_properties, (key, value))
    return dataclasses.replace(made, user_properties=pairs).pack()


def paho_appended(props: PackedProperties, key: str, value: str) -> bytes:
    """Return props plus one user property as paho reads and packs them: the witness."""
    theirs = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    theirs.unpack(props.packed)  # type: ignore[no-untyped-call]
    theirs.UserProperty = (key, value)  # paho appends it to those it read
    packed: bytes = theirs.pack()  # type: ignore[no-untyped-call]
    return packed


def test_the_appended_property_kept_per_kind_is_the_one_packed_afresh() -> None:
    kinds = PublishProperties("alpha", {TARGET: "beta"})
    props = kinds.inbox(TARGET, "command_request")
    values = [sign(TOPIC, b'{"n":%d}' % n, KEY) for n in range(3)] + ["short", "é" * 3]
    for value in values * 2:  # the second time from what was kept
        made = with_user_property(props, "vox-sig", value).packed
        # The bytes a signed publish carries, unchanged: as packed afresh, ours and paho's.
        assert made == fresh(props, "vox-sig", value) == paho_appended(props, "vox-sig", value)
        assert signature_of(made, "vox-sig") == value
    assert props.packed == kinds.inbox(TARGET, "command_request").packed


def test_each_kind_keeps_its_own_and_an_expiry_spliced_in_is_signed_too() -> None:
    request = vox_properties(type="command_request", sender="alpha")
    result = vox_properties(type="command_result", sender="alpha")
    first = with_user_property(request, "vox-sig", "x" * 10).packed
    second = with_user_property(result, "vox-sig", "x" * 10).packed  # same key, same length
    assert first != second
    assert (
        second == fresh(result, "vox-sig", "x" * 10) == paho_appended(result, "vox-sig", "x" * 10)
    )
    expiring = vox_properties(type="status", sender="alpha", expiry=30)
    made = with_user_property(expiring, "vox-sig", "v").packed
    assert made == fresh(expiring, "vox-sig", "v") == paho_appended(expiring, "vox-sig", "v")
    kinds = PublishProperties("alpha", {TARGET: "beta"})
    spliced = with_user_property(kinds.inbox(TARGET, "command_request", expiry=30), "vox-sig", "v")
    assert decode(spliced.packed) == MessageProperties(
        payload_format_indicator=1,
        message_expiry_interval=30,
        content_type="application/json",
        user_properties=(
            ("vox-type", "command_request"),
            ("vox-from", "alpha"),
            ("vox-to", "beta"),
            ("vox-sig", "v"),
        ),
    )


# Packed by the tree before the properties were vox-owned (paho's Properties then): a
# signed publish's properties must stay these bytes.
PINNED = {
    "inbox": b"\x64\x01\x01\x03\x00\x10application/json"
    b"\x26\x00\x08vox-type\x00\x0fcommand_request\x26\x00\x08vox-from\x00\x05alpha"
    b"\x26\x00\x06vox-to\x00\x04beta\x26\x00\x07vox-sig\x00\x06k1.AbC",
    "inbox, an expiry spliced in": b"\x64\x02\x00\x00\x00\x1e\x01\x01\x03\x00\x10application/json"
    b"\x26\x00\x08vox-type\x00\x0fcommand_request\x26\x00\x08vox-from\x00\x05alpha"
    b"\x26\x00\x06vox-to\x00\x04beta\x26\x00\x07vox-sig\x00\x01k",
    "own, with its expiry": b"\x52\x01\x01\x02\x00\x00\x00\x3c\x03\x00\x10application/json"
    b"\x26\x00\x08vox-type\x00\x0cagent_status\x26\x00\x08vox-from\x00\x05alpha"
    b"\x26\x00\x07vox-sig\x00\x01k",
}


def test_the_packed_bytes_of_a_signed_publish_are_the_ones_they_were() -> None:
    kinds = PublishProperties("alpha", {TARGET: "beta"})
    made = {
        "inbox": with_user_property(kinds.inbox(TARGET, "command_request"), "vox-sig", "k1.AbC"),
        "inbox, an expiry spliced in": with_user_property(
            kinds.inbox(TARGET, "command_request", expiry=30), "vox-sig", "k"
        ),
        "own, with its expiry": with_user_property(
            kinds.own("agent_status", expiry=60), "vox-sig", "k"
        ),
    }
    assert {kind: props.packed for kind, props in made.items()} == PINNED
