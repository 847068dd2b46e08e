"""The framework's ledger actions: one vocabulary for every row it writes and reads back.

A `StrEnum`, so a member is stored, hashed and compared as its plain text: ledgers written
before it existed read back the same (docs/ledger.md, "Rows"). A role's own `record()` rows
(examples/freelance.py's "notified", ...) keep their own words; these are the framework's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["AFTER_CANCEL", "DONE_ACTIONS", "STARTED_ACTIONS", "LedgerAction", "sql_list"]


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


# The outcome of a command's end row (`completed`, `failed`) after its `canceling` row: the
# answer came up from below after the cancel, and was relayed as it is (docs/ledger.md).
AFTER_CANCEL: Final = "after_cancel"


def sql_list(actions: tuple[LedgerAction, ...]) -> str:
    """Return actions as a SQL list of literals, for `action IN (...)`."""
    return ", ".join(f"'{action}'" for action in actions)
