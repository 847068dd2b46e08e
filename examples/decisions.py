"""The human's decisions in the freelance example: what a verdict means, as pure functions.

The coordinator records a decision and still decides nothing (seed 003, phase 1): only an
approved job holds capacity, an undecided one holds none and blocks nothing, a rejected one
frees nothing it did not hold. The root relays a decision to the coordinator that notified
the job; the ids each hop knows a job by are worked out here (examples/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from uuid import NAMESPACE_URL, UUID, uuid5

from vox_mqtt.protocol.messages import parse_timestamp

from .jobbook import APPROVE, BookedJob
from .schedule import Booking, WeeklySchedule

__all__ = [
    "ALREADY_DECIDED",
    "JOB_EXPIRED",
    "OVERLAPS",
    "UNKNOWN_JOB",
    "Recorded",
    "Refusal",
    "judge",
    "notified_as",
    "overlapping",
    "translate_overlaps",
]

# The codes of a refused decision's command_error (docs/messages.md, decisions).
UNKNOWN_JOB: Final = "UNKNOWN_JOB"
ALREADY_DECIDED: Final = "ALREADY_DECIDED"
JOB_EXPIRED: Final = "JOB_EXPIRED"
# The field of a job_detected that lists the undecided jobs overlapping it.
OVERLAPS: Final = "overlaps_undecided"
_MAX_OVERLAPS: Final = 100  # what a notification lists; a root relays no more than this


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A decision that cannot be recorded, and why (one line for a person)."""

    code: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A decision to record: the verdict and what it changes, for the answer and the ledger."""

    verdict: str
    outcome: str
    over_minutes: float = 0.0  # an approval beyond the allotted time: by how much


def overlapping(job: Booking, undecided: Mapping[str, Booking]) -> list[str]:
    """Return the ids of the undecided jobs whose window overlaps this job's, in order."""
    return [
        job_id
        for job_id, other in undecided.items()
        if max(job.start, other.start) < min(job.end, other.end)
    ][:_MAX_OVERLAPS]


def judge(
    verdict: str,
    job: BookedJob | None,
    *,
    job_id: str,
    approved: Iterable[Booking],
    schedule: WeeklySchedule,
    now: datetime,
) -> Refusal | Recorded:
    """Tell what the human's verdict on a notified job means, or why it cannot be recorded.

    approved: the other approved jobs. An approval is the human's to make even when the
    approved jobs already take the time (the coordinator decides nothing): it is recorded,
    and the outcome says by how much the allotted time is exceeded.
    """
    if job is None:
        return Refusal(code=UNKNOWN_JOB, reason=f"no job was notified as {job_id}")
    if job.decision is not None:
        word = "approved" if job.decision == APPROVE else "rejected"
        return Refusal(
            code=ALREADY_DECIDED,
            reason=f"job {job_id} was already {word} at {job.decided_at}; a decision is final",
        )
    if parse_timestamp(job.end_time) <= now:
        return Refusal(
            code=JOB_EXPIRED, reason=f"job {job_id} expired: its window ended at {job.end_time}"
        )
    if verdict != APPROVE:
        return Recorded(
            verdict=verdict, outcome="nothing booked: it held no capacity, so none is freed"
        )
    fit = schedule.fit(job.booking(), approved)
    if fit.fits:
        return Recorded(verdict=verdict, outcome=f"booked: {fit.reason}")
    over = job.estimated_effort_minutes - max(fit.allotted_minutes - fit.booked_minutes, 0.0)
    return Recorded(
        verdict=verdict,
        outcome=f"booked {over:.0f} min over the allotted time: {fit.reason}",
        over_minutes=over,
    )


def notified_as(notifier: UUID, received: UUID) -> UUID:
    """Return the id a master notifies a received job_detected under: one per job and master.

    Derived, not drawn: a master can name the notification of any job it received (the
    overlaps it relays) without a lookup, and a second notification would be the same message.
    """
    return uuid5(NAMESPACE_URL, f"vox-notified:{notifier}:{received}")


def translate_overlaps(value: object, notifier: UUID) -> list[str]:
    """Return a received job's overlap list as the ids this master notified those jobs as.

    What is not a list of message ids is dropped: the list came from a child.
    """
    if not isinstance(value, list):
        return []
    ids: list[str] = []
    for item in value[:_MAX_OVERLAPS]:
        try:
            ids.append(str(notified_as(notifier, UUID(str(item)))))
        except ValueError:
            continue
    return ids
