"""The publish properties of an inbox message: the cached kinds, and a deadline's expiry."""

from __future__ import annotations

from uuid import uuid4

from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.transport.publishprops import PublishProperties, vox_properties


def _unpacked(packed: bytes) -> dict[str, object]:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.unpack(packed)  # type: ignore[no-untyped-call]
    return dict(props.json())  # type: ignore[no-untyped-call]


NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,30}", fullmatch=True)


@given(expiry=st.integers(min_value=0, max_value=2**32 - 1), name=NAMES)
def test_an_expiry_spliced_in_reads_as_paho_packs_it(expiry: int, name: str) -> None:
    target = uuid4()
    kinds = PublishProperties("operator", {target: name})
    spliced = kinds.inbox(target, "command_request", expiry=expiry).pack()  # type: ignore[no-untyped-call]
    built = vox_properties(type="command_request", sender="operator", target=name, expiry=expiry)
    assert _unpacked(spliced) == _unpacked(built.pack())  # type: ignore[no-untyped-call]
    assert _unpacked(spliced)["MessageExpiryInterval"] == expiry


def test_the_cached_kind_is_not_changed_by_an_expiry() -> None:
    target = uuid4()
    kinds = PublishProperties("operator", {target: "root"})
    plain = kinds.inbox(target, "command_request").pack()  # type: ignore[no-untyped-call]
    kinds.inbox(target, "command_request", expiry=30)
    assert kinds.inbox(target, "command_request").pack() == plain  # type: ignore[no-untyped-call]
    assert "MessageExpiryInterval" not in _unpacked(plain)
