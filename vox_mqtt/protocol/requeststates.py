"""A request's states at one level, as the wire, the ledger's readers and the views name them.

Plain names with no model behind them (docs/messages.md, "A request's life"), so a verb that
only prints a report (`vox request show`, protocol/canceling.py) loads no pydantic;
protocol/lifecycle.py builds its payloads on them and re-exports them.
"""

from __future__ import annotations

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

RequestState = Literal[
    "received",
    "working",
    "delegated",
    "canceling",
    "completed",
    "failed",
    "canceled",
    "expired",
    "rejected",
    "unknown",
]
# A level's part may also say the level below did not answer in time.
PartState = Literal[RequestState, "unreachable"]
REQUEST_STATES: Final = frozenset(RequestState.__args__)  # type: ignore[attr-defined]
# The states after which a request does nothing more.
FINAL_STATES: Final = frozenset({"completed", "failed", "canceled", "expired", "rejected"})
# What a cancel_report may say the request is in after the cancel: `canceling` while
# something of it may still run (its handler has not ended, or its child has not confirmed).
CANCEL_STATES: Final = FINAL_STATES | {"canceling", "unknown"}
