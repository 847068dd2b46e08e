"""A ledger's message_source forms: the digest rows keep, the sealed value a restart needs."""

from __future__ import annotations

import json
import os

import pytest

from vox_mqtt.ledger._sources import SEALED, SourceKeeper
from vox_mqtt.protocol.errors import LedgerError

CLIENT = "jöb-7@example.com"


def test_a_sealed_source_opens_under_its_key_only_and_never_shows_in_clear() -> None:
    keeper = SourceKeeper(clear=False, key=os.urandom(32))
    sealed = keeper.seal(CLIENT, "logs.db")
    assert sealed.startswith(SEALED)
    assert CLIENT not in sealed
    assert keeper.seal(CLIENT, "logs.db") != sealed  # a fresh nonce each time
    assert keeper.unseal(sealed, "logs.db") == CLIENT
    other = SourceKeeper(clear=False, key=os.urandom(32))
    assert other.unseal(sealed, "logs.db") is None
    # A digest is never taken for a source.
    digest = keeper.stored(CLIENT, "logs.db")
    assert digest.startswith("hmac:")
    assert keeper.unseal(digest, "logs.db") is None


def test_an_outbox_payload_gets_its_envelopes_source_back_and_nothing_else() -> None:
    keeper = SourceKeeper(clear=False, key=os.urandom(32))
    sealed = keeper.seal(CLIENT, "logs.db")
    message = {
        "message_id": "m",
        "message_source": sealed,
        "details": {"message_source": "a field of the payload", "note": "ünïcode"},
    }
    payload = json.dumps(message, ensure_ascii=False).encode()
    back = json.loads(keeper.unseal_payload(payload, "logs.db"))
    assert back == {**message, "message_source": CLIENT}
    # Sealed under another key (a replaced logs.key): the runtime default, never the token.
    stranger = SourceKeeper(clear=False, key=os.urandom(32))
    assert json.loads(stranger.unseal_payload(payload, "logs.db"))["message_source"] == "vox-mqtt"


def test_clear_sources_are_kept_as_they_are_and_a_closed_ledger_says_so() -> None:
    clear = SourceKeeper(clear=True, key=None)
    assert clear.seal(CLIENT, "logs.db") == CLIENT
    assert clear.unseal(CLIENT, "logs.db") == CLIENT
    closed = SourceKeeper(clear=False, key=None)
    with pytest.raises(LedgerError, match=r"logs\.db is not open"):
        closed.seal(CLIENT, "logs.db")
