"""The ledger's canonical JSON: the text every row's hash is taken over, byte for byte."""

from __future__ import annotations

import json
import math
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vox_mqtt.ledger._schema import _canonical, _chain_hash

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _reference(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@given(JSON)
def test_canonical_text_is_json_dumps_with_the_ledger_options(value: Any) -> None:
    # Every ledger written so far was hashed over json.dumps's text: any other text would
    # break `vox ledger verify` on them.
    assert _canonical(value) == _reference(value)


def test_a_row_hashes_as_before() -> None:
    content: tuple[Any, ...] = (7, "2026-12-04T19:00:00.123+00:00", "message", "received")
    content += ("a", "b", "m", "command_request", None, "2026-12-04T19:00:00.100+00:00")
    content += (
        None,
        None,
        '{"command":"echo","message_source":"hmac:ab","topic":"vox/x/inbox/y"}',
    )
    # The digest this row had before the encoder was built once (json.dumps's text).
    assert _chain_hash("0" * 64, content) == (
        "f77c21be769ca8d37d3c886b9e8a16329bc14832a165ac86ed531da8a8b1860f"
    )


@pytest.mark.parametrize("value", [math.nan, math.inf, {"x": -math.inf}])
def test_not_a_number_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        _canonical(value)


def test_a_value_json_cannot_write_is_refused() -> None:
    with pytest.raises(TypeError):
        _canonical({"id": uuid4()})
