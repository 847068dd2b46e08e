"""The one table between a request's states and the ledger rows that record them."""

from __future__ import annotations

import pytest

from vox_mqtt.ledger.actions import ROW_STATES, STATE_ROWS, LedgerAction, row_of
from vox_mqtt.protocol.requeststates import RequestState


def test_a_state_is_written_as_the_row_the_ledger_has_always_written() -> None:
    # The ledger is append-only and hash-chained: these words are in every ledger written.
    assert {str(state): str(row_of(state)) for state in STATE_ROWS} == {
        "received": "received",
        "working": "started",
        "delegated": "delegated",
        "canceling": "canceling",
        "completed": "completed",
        "failed": "failed",
        "canceled": "canceled",
        "expired": "expired",
        "rejected": "rejected",
    }
    assert row_of(RequestState.WORKING) is LedgerAction.STARTED


def test_every_state_but_unknown_has_a_row() -> None:
    assert set(RequestState) - set(STATE_ROWS) == {RequestState.UNKNOWN}
    with pytest.raises(KeyError):
        row_of(RequestState.UNKNOWN)


def test_a_row_read_back_gives_the_state_it_records() -> None:
    for state, row in STATE_ROWS.items():
        assert ROW_STATES[row] is state
    # A row read from SQLite is plain text: it finds its state all the same.
    assert ROW_STATES["started"] is RequestState.WORKING
    assert "sent" not in ROW_STATES  # not a state of the request
