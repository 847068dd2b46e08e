"""The operator's jobs: the inbox's job notifications numbered, with the decisions sent on them.

Pure functions over what the console keeps (inbox.jsonl, decisions.jsonl): `vox inbox` shows
the numbers and `vox decide N` takes one (docs/operations.md, deciding a job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from vox_mqtt.protocol.domain import MSG_JOB_DETECTED
from vox_mqtt.protocol.messages import parse_timestamp

__all__ = ["OVERLAPS", "VERDICTS", "Job", "choose_job", "number_jobs", "verdict_word"]

VERDICTS: Final = ("approve", "reject")
OVERLAPS: Final = "overlaps_undecided"  # what a coordinator names in a job it notifies
_WORDS: Final = {"approve": "approved", "reject": "rejected"}


@dataclass(frozen=True, kw_only=True)
class Job:
    """A job notification in the operator's inbox, its number and the decision sent on it."""

    number: int  # 1 for the first job the inbox kept; a job keeps its number
    message_id: str
    entry: Mapping[str, Any]  # the inbox entry
    decision: Mapping[str, Any] | None = None  # the decisions.jsonl entry once recorded
    overlaps: tuple[int, ...] = field(default=())  # numbers of the jobs it overlapped

    @property
    def end_time(self) -> str | None:
        """Return the end of the job's window as the notification gives it."""
        details = self.entry.get("details")
        value = details.get("end_time") if isinstance(details, Mapping) else None
        return value if isinstance(value, str) else None


def verdict_word(verdict: object) -> str:
    """Return "approved" or "rejected" for a verdict ("decided" for anything else)."""
    return _WORDS.get(str(verdict), "decided")


def number_jobs(
    notifications: Sequence[Mapping[str, Any]], decisions: Sequence[Mapping[str, Any]]
) -> list[Job]:
    """Number the job notifications in the order they arrived; pair each with its decision.

    A job keeps its number whatever is decided or arrives later, so `vox decide 2` twice
    names the same job twice (and is refused the second time), never the next one.
    """
    decided = {d["job"]: d for d in decisions if isinstance(d.get("job"), str)}
    ids: dict[str, int] = {}
    jobs: list[tuple[str, Mapping[str, Any]]] = []
    for entry in notifications:
        message_id = entry.get("message_id")
        if entry.get("type") != MSG_JOB_DETECTED or not isinstance(message_id, str):
            continue
        if message_id in ids:
            continue  # kept twice (a redelivery the console did not dedupe): one job
        ids[message_id] = len(jobs) + 1
        jobs.append((message_id, entry))
    numbered = []
    for message_id, entry in jobs:
        details = entry.get("details")
        named = details.get(OVERLAPS) if isinstance(details, Mapping) else None
        overlaps = tuple(
            ids[str(other)]
            for other in (named if isinstance(named, list) else [])
            if str(other) in ids
        )
        numbered.append(
            Job(
                number=ids[message_id],
                message_id=message_id,
                entry=entry,
                decision=decided.get(message_id),
                overlaps=overlaps,
            )
        )
    return numbered


def choose_job(jobs: Sequence[Job], number: int, *, now: datetime) -> Job | str:
    """Return job #number if it can be decided now, else why not (one line for a person)."""
    if not 1 <= number <= len(jobs):
        held = f"{len(jobs)} job(s), #1 to #{len(jobs)}" if jobs else "no job"
        return f"no job #{number}: the inbox holds {held} (`vox inbox` lists them)"
    job = jobs[number - 1]
    if job.decision is not None:
        word = verdict_word(job.decision.get("verdict"))
        return (
            f"job #{number} was already {word} at {job.decision.get('decided_at', '?')}; "
            "a decision is final"
        )
    end = job.end_time
    try:
        ended = end is not None and parse_timestamp(end) <= now
    except ValueError:
        ended = False  # the coordinator checks the window again
    if ended:
        return f"job #{number} expired: its window ended at {end}"
    return job
