"""The operator's numbered jobs: stable numbers, decisions, overlaps, what may be decided."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import uuid4

from vox_mqtt.cli.decide import job_summary
from vox_mqtt.console.decisions import Job, choose_job, number_jobs

NOW = datetime.fromisoformat("2026-01-10T00:00:00+00:00")


def notification(end: str = "2026-01-12T17:00:00+00:00", **details: Any) -> dict[str, Any]:
    return {
        "message_id": str(uuid4()),
        "type": "job_detected",
        "details": {"end_time": end, **details},
    }


def test_jobs_are_numbered_in_arrival_order_and_keep_their_numbers() -> None:
    a, b = notification(), notification()
    failure = {"message_id": str(uuid4()), "type": "system_failure", "details": {}}
    c = notification(overlaps_undecided=[a["message_id"], b["message_id"], "unknown", [1]])
    jobs = number_jobs([a, failure, b, a, c], [])
    assert [(j.number, j.message_id) for j in jobs] == [
        (1, a["message_id"]),
        (2, b["message_id"]),
        (3, c["message_id"]),
    ]
    assert jobs[2].overlaps == (1, 2)  # what it names that the inbox holds
    # Deciding a job changes no number: #3 stays #3.
    decided = number_jobs([a, b, c], [{"job": a["message_id"], "verdict": "approve"}])
    assert [j.number for j in decided] == [1, 2, 3]
    assert decided[0].decision == {"job": a["message_id"], "verdict": "approve"}


def test_choose_job_refuses_what_cannot_be_decided_with_the_reason() -> None:
    a, b = notification(), notification(end="2026-01-09T17:00:00+00:00")
    decision = {"job": a["message_id"], "verdict": "approve", "decided_at": "2026-01-09T10:00Z"}
    jobs = number_jobs([a, b], [decision])
    assert choose_job(jobs, 0, now=NOW) == (
        "no job #0: the inbox holds 2 job(s), #1 to #2 (`vox inbox` lists them)"
    )
    assert (
        choose_job([], 1, now=NOW) == "no job #1: the inbox holds no job (`vox inbox` lists them)"
    )
    assert choose_job(jobs, 1, now=NOW) == (
        "job #1 was already approved at 2026-01-09T10:00Z; a decision is final"
    )
    assert choose_job(jobs, 2, now=NOW) == (
        "job #2 expired: its window ended at 2026-01-09T17:00:00+00:00"
    )
    fresh = number_jobs([notification(), notification(end="not a time")], [])
    assert isinstance(choose_job(fresh, 1, now=NOW), Job)
    assert isinstance(choose_job(fresh, 2, now=NOW), Job)  # the coordinator checks it again


def test_the_inbox_line_says_the_decision_or_the_overlaps() -> None:
    a, b = notification(), notification()
    c = notification(overlaps_undecided=[a["message_id"], b["message_id"]])
    jobs = number_jobs(
        [a, b, c],
        [{"job": a["message_id"], "verdict": "approve", "decided_at": "T", "outcome": "booked"}],
    )
    assert job_summary(jobs[0], jobs) == "approved at T: booked"
    assert job_summary(jobs[1], jobs) == (
        "undecided; overlaps no undecided job: `vox decide 2 approve|reject`"
    )
    assert job_summary(jobs[2], jobs) == (
        "undecided; overlaps #1 (approved), #2 (undecided): `vox decide 3 approve|reject`"
    )
