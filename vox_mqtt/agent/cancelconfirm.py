"""A master's wait for every level to confirm a cancel (agent/lifecycle.py, `cancel`).

What the cancel has done is decided by protocol/canceling.py from the child's nested status
report; this asks for that report again, bounded, until no level is left unconfirmed.

A round that got no answer in time does not undo what an earlier round showed: a level's
confirmation is its own ledger's `canceled` row (docs/messages.md, "A cancel tells the
truth"), which no later round takes back, so a level that did not answer a later, shorter
round (`unreachable`: a loaded machine, a frozen agent) is no less confirmed for it. What
is told is the round that went furthest down.
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


async def confirmed(
    ask: Ask, name: str, ends: float, *, most: float, clock: Callable[[], float] = time.monotonic
) -> dict[str, Any]:
    """Return the verdict (`state`, `level`, `since`, `line`) and the report it is from (`levels`).

    `ask(within)` returns the child's nested status report, asked within that many seconds
    (CommandFailed, VoxError: no report). `name` is the child's name as the master knows it;
    `ends` (by `clock`, time.monotonic) when to stop asking; `most` the longest one round may
    take. Still `canceling` at `ends`: the round that went furthest down is told, a later one
    only if it went as far and the level it names answered (`_further`).
    """
    pause = CONFIRM_POLL
    told: dict[str, Any] | None = None
    while True:
        within = min(max(ends - clock(), LEAST_ROUND), most)
        try:
            levels = await ask(within)
        except (CommandFailed, VoxError) as exc:
            why = exc.error if isinstance(exc, CommandFailed) else str(exc)
            levels = {"state": "unreachable", "why": why[:MAX_TEXT]}
        verdict = cancel_verdict(levels, name)
        found = {**verdict.as_json(), "levels": levels}
        if verdict.state != "canceling":
            return found
        if told is None or _further(found, told):
            told = found
        if clock() >= ends:
            return told
        await asyncio.sleep(min(pause, max(0.0, ends - clock())))
        pause = min(2 * pause, CONFIRM_POLL_MOST)


def _further(found: dict[str, Any], told: dict[str, Any]) -> bool:
    """Tell whether a round's `canceling` verdict tells more than the one told so far.

    Deeper: more levels confirmed. As deep: the newest word of the level it names, unless
    that level gave none this round (`unreachable`), which says nothing new of it.
    """
    level, before = int(found["level"]), int(told["level"])
    if level != before:
        return level > before
    return _part(found["levels"], level).get("state") != "unreachable"


def _part(levels: dict[str, Any], level: int) -> dict[str, Any]:
    """The part of a nested report at `level` (1 = the top one)."""
    part: Any = levels
    for _ in range(level - 1):
        part = part.get("below") if isinstance(part, dict) else None
    return part if isinstance(part, dict) else {}
