"""Where a request stands, worked out from rows and times: pure functions, no I/O.

The lifecycle part (agent/lifecycle.py) reads the ledger and the clock and calls these;
tests/unit/test_standing.py covers them (docs/messages.md, "A request's life").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vox_mqtt.ledger.actions import ROW_STATES
from vox_mqtt.protocol.lifecycle import MAX_HISTORY

__all__ = ["history_of", "part_of", "progress_delay"]


def history_of(own: Iterable[Mapping[str, Any]], me: str) -> list[dict[str, str]]:
    """The states a request went through here, oldest first, from its own rows.

    Only the rows of the request as this agent received it count (its target is this
    agent); anything else about the id (a copy it sent, had it sent one) does not.
    """
    return [
        {"state": ROW_STATES[row["action"]], "at": str(row["recorded_at"])}
        for row in own
        if row["action"] in ROW_STATES and row["target"] == me
    ]


def part_of(
    own: Iterable[Mapping[str, Any]], cancels: Sequence[Mapping[str, Any]], me: str
) -> dict[str, Any]:
    """This level's part of a status report (without its child's part, `below`)."""
    history = history_of(own, me)
    if not history:
        if cancels:  # canceled before it came: it never will run here
            return {"state": "canceled", "since": str(cancels[0]["recorded_at"])}
        return {"state": "unknown"}
    return {
        "state": history[-1]["state"],
        "since": history[-1]["at"],
        "history": history[-MAX_HISTORY:],
    }


def progress_delay(now: float, last: float, interval: float, waiting: bool) -> float | None:
    """When a progress report may leave: None for now, else in how many seconds.

    `last` is when the request's window last opened, `waiting` whether a report already
    waits for the next one (it is then replaced, and goes when the window opens).
    """
    if not waiting and now - last >= interval:
        return None
    return max(0.0, last + interval - now)
