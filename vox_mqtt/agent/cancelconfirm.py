"""A master's wait for every level to confirm a cancel (agent/lifecycle.py, `cancel`).

What the cancel has done is decided by protocol/canceling.py from the child's nested status
report; this asks for that report again, bounded, until no level is left unconfirmed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from vox_mqtt.protocol.canceling import cancel_verdict
from vox_mqtt.protocol.errors import CommandFailed, VoxError
from vox_mqtt.protocol.lifecycle import MAX_TEXT

__all__ = ["CONFIRM_POLL", "CONFIRM_POLL_MOST", "confirmed", "reported"]

# A cancel not yet confirmed by every level: how soon its child is asked again, doubled
# after each round up to CONFIRM_POLL_MOST (each round is a query at every level below).
CONFIRM_POLL: Final = 0.25
CONFIRM_POLL_MOST: Final = 2.0
# The least a status query gets, even once the cancel's own wait is spent.
LEAST_ROUND: Final = 1.0

Ask = Callable[[float], Awaitable[dict[str, Any]]]


async def reported(
    report: dict[str, Any], ask: Ask, name: str, ends: float, *, most: float
) -> dict[str, Any]:
    """What a cancel has done, from the child's cancel_report and, when needed, its levels.

    `canceled` and `canceling` are checked by status rounds (`confirmed`); so is an end that
    came up from below after an earlier cancel (its `why`): the levels say where it ran.
    Any other state (`unknown`, an end reached before the cancel) is told as it is.
    """
    if report["state"] not in ("canceled", "canceling") and not report.get("why"):
        verdict = cancel_verdict(report, name)
        return {**report, "line": verdict.line, "level": verdict.level}
    return {**report, **await confirmed(ask, name, ends, most=most)}


async def confirmed(ask: Ask, name: str, ends: float, *, most: float) -> dict[str, Any]:
    """Return the verdict (`state`, `level`, `since`, `line`) and the last report (`levels`).

    `ask(within)` returns the child's nested status report, asked within that many seconds
    (CommandFailed, VoxError: no report). `name` is the child's name as the master knows it;
    `ends` (time.monotonic()) when to stop asking; `most` the longest one round may take.
    """
    pause = CONFIRM_POLL
    while True:
        within = min(max(ends - time.monotonic(), LEAST_ROUND), most)
        try:
            levels = await ask(within)
        except (CommandFailed, VoxError) as exc:
            why = exc.error if isinstance(exc, CommandFailed) else str(exc)
            levels = {"state": "unreachable", "why": why[:MAX_TEXT]}
        verdict = cancel_verdict(levels, name)
        if verdict.state != "canceling" or time.monotonic() >= ends:
            return {**verdict.as_json(), "levels": levels}
        await asyncio.sleep(min(pause, max(0.0, ends - time.monotonic())))
        pause = min(2 * pause, CONFIRM_POLL_MOST)
