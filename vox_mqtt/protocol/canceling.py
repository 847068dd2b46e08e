"""What a cancel has done, level by level: pure functions over a request's states, no I/O.

A cancel is told as done only when every level that held the request has confirmed that it
cannot run there any more (docs/messages.md, "A request's life"). Until then the request is
`canceling`, and the first level that has not confirmed is named. Three decisions:

- `level_state`: the state one level reports for its part, from its own ledger row, whether
  its handler still runs, and its child's part;
- `answered_after_cancel`: whether a level's end came up from below after it passed its
  cancel down (a result that ran before the cancel reached the level below);
- `cancel_verdict`: what the operator is told, from the root's nested status report.

tests/unit/test_canceling.py covers both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vox_mqtt.protocol.requeststates import FINAL_STATES, MAX_DEPTH

__all__ = [
    "AFTER_CANCEL_WHY",
    "CANCELING_ANSWER",
    "CANCELING_BELOW",
    "CANCELING_HANDLER",
    "CancelVerdict",
    "answered_after_cancel",
    "cancel_verdict",
    "level_name",
    "level_state",
]

# The `why` of a level that is `canceling` (docs/messages.md): what it waits for.
CANCELING_HANDLER: Final = "its handler has not ended yet"
CANCELING_BELOW: Final = "the level below has not confirmed the cancel"
CANCELING_ANSWER: Final = "the level below confirmed; its answer is on its way up"
# The `why` of a level that ended after it passed its cancel down: its answer came from below.
AFTER_CANCEL_WHY: Final = "its answer came up from below after its cancel"
# The states of a level's own rows that say it took a cancel: `canceling` is the row of a
# level that passed it down and waits for its child's answer (docs/ledger.md).
_CANCELED_HERE: Final = frozenset({"canceled", "canceling"})


def level_state(own: str, *, below: str | None, handler_running: bool) -> tuple[str, str | None]:
    """Return (state, why) of one level's part of a status report.

    `own` is the state its own ledger rows give, `below` its child's part's state (None when
    it sent the request to no child), `handler_running` whether the handler the cancel cut
    has not ended yet. A level canceled here is `canceled` only when nothing of the request
    can run any more, here or below: its handler ended, and its child's part is final. A
    child's `unknown` is no confirmation (the request may still be on its way to it), nor is
    `unreachable` (a frozen or cut-off child may run it when it is back). `own` is
    `canceling` at a level that passed the cancel down and waits for its child's answer:
    it stays `canceling` until that answer is relayed up and its own end is recorded, so
    `canceled` is told only where the answer upward says so too.
    """
    if own not in _CANCELED_HERE:
        return own, None
    if handler_running:
        return "canceling", CANCELING_HANDLER
    if below is not None and below not in FINAL_STATES:
        return "canceling", CANCELING_BELOW
    if own == "canceling":
        return "canceling", CANCELING_ANSWER
    return "canceled", None


def answered_after_cancel(part: Mapping[str, Any]) -> bool:
    """Tell whether a level ended (not `canceled`) after it passed its cancel down.

    Its history holds `canceling` (its row when the cancel passed down), then its end: the
    answer that came up from below after the cancel (a result the level below had produced
    before its cancel reached it, or a timeout while it never confirmed), relayed as it is.
    """
    state = str(part.get("state", ""))
    if state not in FINAL_STATES or state == "canceled":
        return False
    return any(isinstance(h, Mapping) and h.get("state") == "canceling" for h in _history(part))


def level_name(depth: int, root_name: str) -> str:
    """Name a level of a nested report as the operator sees it: the root, then numbered."""
    return root_name if depth == 0 else f"level {depth + 1}"


@dataclass(frozen=True, kw_only=True)
class CancelVerdict:
    """What a cancel has done, as the operator is told it.

    `state`: `canceled` (every level confirmed: nothing runs), `canceling` (`level` has not
    confirmed yet), `unknown` (the root never received the request), or the final state the
    request reached anyway (`completed`, `failed`, ...) at `level` (1 = the root): a level
    the cancel reached too late, whose result is then recorded after the cancel.
    """

    state: str
    level: int | None
    since: str | None
    line: str

    def as_json(self) -> dict[str, Any]:
        """Return the verdict as `vox cancel --json` and the console's API give it."""
        return {"state": self.state, "level": self.level, "since": self.since, "line": self.line}


def _levels(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    part: Any = report
    while isinstance(part, Mapping) and len(found) <= MAX_DEPTH:
        found.append(part)
        part = part.get("below")
    return found


def _at(part: Mapping[str, Any]) -> str:
    since = part.get("since")
    return f" since {since}" if since else ""


def cancel_verdict(report: Mapping[str, Any], root_name: str) -> CancelVerdict:
    """Decide what a cancel has done from the root's nested status report (`request_status`).

    Walk down the levels: each `canceled` one confirmed; a `canceling` one waits for its
    handler (when nothing is below it) or for the level below; a level still `received`,
    `working`, `delegated`, `unknown` or `unreachable` under a canceled one has not
    confirmed; a level that ended on its own (`completed`, ...) ran before its cancel came.
    A level that passed the cancel down and then relayed the answer that came up anyway
    (`answered_after_cancel`) is passed through: the level below says what happened.
    """
    levels = _levels(report)
    root = levels[0] if levels else {}
    first = str(root.get("state", "unknown"))
    since = root.get("since")
    since = None if since is None else str(since)
    if first == "unknown":
        return CancelVerdict(
            state="unknown", level=None, since=None, line=f"unknown to the root ({root_name})"
        )
    if first in FINAL_STATES and first != "canceled" and not answered_after_cancel(root):
        return CancelVerdict(
            state=first, level=1, since=since, line=f"not canceled, already {first}{_at(root)}"
        )
    canceled: list[str] = []
    for depth, part in enumerate(levels):
        state = str(part.get("state", "unknown"))
        name = level_name(depth, root_name)
        last = depth == len(levels) - 1
        waits = state == "canceling" and part.get("why") != CANCELING_ANSWER
        passed = waits or answered_after_cancel(part)
        if state == "canceled" or (passed and not last):
            canceled.append(name)
            continue
        if state in FINAL_STATES:
            where = f"canceled at {', '.join(canceled)}, but" if canceled else "not canceled:"
            line = f"{where} {name} had {state}{_at(part)}: the cancel reached it after it ran"
            return CancelVerdict(state=state, level=depth + 1, since=since, line=line)
        why = part.get("why")
        line = f"canceling{_at(root)}: {name} has not confirmed ({state}"
        line += f": {why})" if why else ")"
        return CancelVerdict(state="canceling", level=depth + 1, since=since, line=line)
    line = f"canceled{_at(root)}"
    started = [
        level_name(depth, root_name)
        for depth, part in enumerate(levels)
        if any(isinstance(h, Mapping) and h.get("state") == "working" for h in _history(part))
    ]
    if started:
        # Canceled everywhere, but a handler had started: what it did before its cancel
        # reached it is done (its answer is CANCELED, never its result).
        line += f"; its handler had started at {', '.join(started)} before the cancel came"
    return CancelVerdict(state="canceled", level=None, since=since, line=line)


def _history(part: Mapping[str, Any]) -> list[Any]:
    history = part.get("history")
    return history if isinstance(history, list) else []
