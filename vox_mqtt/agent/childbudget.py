"""What one child's events may cost its master: a rate and a backlog (docs/security.md, F25).

A leaf that sends 1,100 job notifications made its coordinator forward every one, and the
root re-send each into its offline operator's queue. Now a master takes a child's events
at `child_rate` a second (after `child_backlog` at once) and with at most `child_backlog`
of them in work at a time: handled here, or sent on by their handler and not yet
acknowledged by whom they went to (`CAUSE` names the child in the handler's task, and the
outbox counts what it sends there). Beyond either, an event is refused unacknowledged: its
sender keeps it in its outbox and re-sends it later, and the master posts the child as
misbehaving once per episode (a war-room incident, no work for a while).
"""

from __future__ import annotations

from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final
from uuid import UUID

from vox_mqtt.observe.statusbounds import ChangeBudget

__all__ = ["CAUSE", "FLOODING", "REPORT_EVERY", "ChildBudgets", "flood_problem"]

# The child whose event the running handler serves: set in that handler's task only.
CAUSE: ContextVar[UUID | None] = ContextVar("vox_event_cause", default=None)
# The reason label of `rejected` for an event refused over its child's limits.
FLOODING: Final = "FLOODING"


def flood_problem(*, in_work: int, backlog: int, rate_allows: bool, rate: float) -> str | None:
    """Return why a child's event is over its limits now, or None to take it (pure)."""
    if in_work >= backlog:
        return f"{in_work} of its events still in work here (child_backlog {backlog})"
    if not rate_allows:
        return f"sends events faster than {rate:g} a second after {backlog} at once (child_rate)"
    return None


# A child over its limits is reported again at most this often (its misbehaving hold lasts
# observe.status.MISBEHAVING_HOLD, 60 s: a flood that goes on keeps it held).
REPORT_EVERY: Final = 30.0


@dataclass
class _Child:
    bucket: ChangeBudget
    reported_at: float | None = None  # when its last refusal was reported


class ChildBudgets:
    """Each child's rate bucket and events in work; who is over its limits now."""

    def __init__(self) -> None:
        self._children: dict[UUID, _Child] = {}
        self._in_work: Counter[UUID] = Counter()

    def in_work(self, child: UUID) -> int:
        """Return how many of a child's events are in work here."""
        return self._in_work[child]

    def started(self, child: UUID) -> None:
        """Count one more piece of work caused by a child's event."""
        self._in_work[child] += 1

    def finished(self, child: UUID) -> None:
        """Count one piece of a child's work done (handled, or acknowledged where it went)."""
        left = self._in_work[child] - 1
        if left > 0:
            self._in_work[child] = left
        else:
            del self._in_work[child]

    def admit(
        self, child: UUID, *, now: float, rate: float, backlog: int
    ) -> tuple[str | None, bool]:
        """Take one event of a child if within its limits; return (problem, report it).

        A refusal is reported (posted) at most once per REPORT_EVERY seconds per child.
        """
        entry = self._children.get(child)
        if entry is None or entry.bucket.burst != backlog or entry.bucket.rate != rate:
            # New, or the config changed (a reload): start from a full bucket.
            entry = _Child(ChangeBudget(burst=backlog, rate=rate, tokens=backlog))
            self._children[child] = entry
        problem = flood_problem(
            in_work=self._in_work[child],
            backlog=backlog,
            rate_allows=entry.bucket.allows(now),
            rate=rate,
        )
        if problem is None:
            entry.bucket.take(now)
            return None, False
        due = entry.reported_at is None or now - entry.reported_at >= REPORT_EVERY
        if due:
            entry.reported_at = now
        return problem, due

    def forget(self, child: UUID) -> None:
        """Drop a former child's bucket (a reload removed it)."""
        self._children.pop(child, None)
