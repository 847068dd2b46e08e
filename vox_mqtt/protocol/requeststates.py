"""A request's states at one level, as the wire, the ledger's readers and the views name them.

One `StrEnum` with no model behind it (docs/messages.md, "A request's life"), so a verb that
only prints a report (`vox request show`, protocol/canceling.py) loads no pydantic;
protocol/lifecycle.py builds its payloads on it and re-exports it. A member is its plain
text: it compares, hashes and serialises as the word the wire carries (`"working"`), so a
state read back from JSON or from a ledger row is the same key as the member. The ledger
writes each state as a row of its own vocabulary (ledger/actions.py, `row_of`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

__all__ = [
    "CANCEL_STATES",
    "FINAL_STATES",
    "MAX_DEPTH",
    "REQUEST_STATES",
    "PartState",
    "RequestState",
]

# How many levels a nested report may hold: deeper than any real tree, and it keeps a
# hostile child from sending a report that is all nesting.
MAX_DEPTH: Final = 16


class RequestState(StrEnum):
    """Where a request stands at one level (docs/messages.md, "A request's life")."""

    RECEIVED = "received"  # recorded and acknowledged here, not started
    WORKING = "working"  # its handler runs here (the ledger's `started` row)
    DELEGATED = "delegated"  # sent on to a child
    CANCELING = "canceling"  # canceled here; something of it may still run here or below
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"  # past its deadline: never started, or given up on
    REJECTED = "rejected"  # refused on arrival
    UNKNOWN = "unknown"  # never received here (it may still be on its way)


# A level's part may also say the level below did not answer in time.
PartState = RequestState | Literal["unreachable"]
REQUEST_STATES: Final = frozenset(RequestState)
# The states after which a request does nothing more.
FINAL_STATES: Final = frozenset(
    {
        RequestState.COMPLETED,
        RequestState.FAILED,
        RequestState.CANCELED,
        RequestState.EXPIRED,
        RequestState.REJECTED,
    }
)
# What a cancel_report may say the request is in after the cancel: `canceling` while
# something of it may still run (its handler has not ended, or its child has not confirmed).
CANCEL_STATES: Final = FINAL_STATES | {RequestState.CANCELING, RequestState.UNKNOWN}
