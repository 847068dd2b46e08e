"""The framework's ledger actions: one vocabulary for every row it writes and reads back.

A `StrEnum`, so a member is stored, hashed and compared as its plain text: ledgers written
before it existed read back the same (docs/ledger.md, "Rows"). A role's own `record()` rows
(examples/freelance.py's "notified", ...) keep their own words; these are the framework's.
The row that records each state a request reaches, and the state each such row gives back,
are one table here (`STATE_ROWS`, `row_of`, `ROW_STATES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from vox_mqtt.protocol.requeststates import RequestState

__all__ = [
    "AFTER_CANCEL",
    "DONE_ACTIONS",
    "ROW_STATES",
    "STARTED_ACTIONS",
    "STATE_ROWS",
    "LedgerAction",
    "row_of",
    "sql_list",
]


class LedgerAction(StrEnum):
    """What a ledger row says happened to its message or event."""

    RECEIVED = "received"  # a message recorded on arrival (the dedupe key)
    SENT = "sent"  # a message recorded before it is published
    REJECTED = "rejected"  # input refused: unparsable, unverified, unauthorized or retained
    DUPLICATE = "duplicate"  # a message seen before: acknowledged again, never acted on
    LATE = "late"  # an answer to a request that already ended here
    STARTED = "started"  # a command's handler runs here
    DELEGATED = "delegated"  # a command's downstream request went to a child
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"  # past its deadline: never started, or given up on by its sender
    CANCELED = "canceled"
    # A cancel passed down for a delegated command: canceled here, its child's answer (its
    # confirmation, docs/messages.md "A cancel tells the truth") still due; no end.
    CANCELING = "canceling"
    VIA = "via"  # a door row: which door (cli, web, mcp, a2a) a request came through
    LEDGER_HEAD = "ledger_head"  # a child's ledger head, witnessed by its master
    LEDGER_PROBE = "ledger_probe"  # a health row: the ledger still takes writes


# A command runs once started or delegated; it is over once completed, failed or answered.
STARTED_ACTIONS: Final = (LedgerAction.STARTED, LedgerAction.DELEGATED)
DONE_ACTIONS: Final = (
    *(LedgerAction.COMPLETED, LedgerAction.FAILED),
    *(LedgerAction.EXPIRED, LedgerAction.CANCELED),
)


# The row that records a request entering each state at one level (protocol/requeststates.py):
# the same word but for `working`, which the ledger has always written `started`. `unknown`
# has no row: it is what a level says of a request it holds no row of.
STATE_ROWS: Final[Mapping[RequestState, LedgerAction]] = MappingProxyType(
    {
        RequestState.RECEIVED: LedgerAction.RECEIVED,
        RequestState.WORKING: LedgerAction.STARTED,
        RequestState.DELEGATED: LedgerAction.DELEGATED,
        RequestState.CANCELING: LedgerAction.CANCELING,
        RequestState.COMPLETED: LedgerAction.COMPLETED,
        RequestState.FAILED: LedgerAction.FAILED,
        RequestState.CANCELED: LedgerAction.CANCELED,
        RequestState.EXPIRED: LedgerAction.EXPIRED,
        RequestState.REJECTED: LedgerAction.REJECTED,
    }
)
# And back: the state a request's row at a level says it entered (a status report's history).
ROW_STATES: Final[Mapping[LedgerAction, RequestState]] = MappingProxyType(
    {row: state for state, row in STATE_ROWS.items()}
)


def row_of(state: RequestState) -> LedgerAction:
    """Return the ledger row that records a request entering `state` (KeyError: `unknown`)."""
    return STATE_ROWS[state]


# The outcome of a command's end row (`completed`, `failed`) after its `canceling` row: the
# answer came up from below after the cancel, and was relayed as it is (docs/ledger.md).
AFTER_CANCEL: Final = "after_cancel"


def sql_list(actions: tuple[LedgerAction, ...]) -> str:
    """Return actions as a SQL list of literals, for `action IN (...)`."""
    return ", ".join(f"'{action}'" for action in actions)
