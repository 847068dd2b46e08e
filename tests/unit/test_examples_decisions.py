"""The freelance example's decisions as pure functions: overlaps, verdicts, ids per hop."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid4

import pytest

from examples.decisions import (
    ALREADY_DECIDED,
    JOB_EXPIRED,
    UNKNOWN_JOB,
    Recorded,
    Refusal,
    judge,
    notified_as,
    overlapping,
    translate_overlaps,
)
from examples.jobbook import BookedJob
from examples.schedule import Booking, WeeklySchedule

NOW = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
WEEK = WeeklySchedule()  # Monday to Friday, 09:00-17:00 UTC; 2026-01-12 is a Monday


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def monday(start: int, end: int, effort: int = 60) -> Booking:
    return Booking(
        start=at(f"2026-01-12T{start:02d}:00:00+00:00"),
        end=at(f"2026-01-12T{end:02d}:00:00+00:00"),
        effort_minutes=effort,
    )


def job(start: int, end: int, effort: int, decision: str | None = None) -> BookedJob:
    window = monday(start, end)
    return BookedJob(
        message_id=str(uuid4()),
        forwarded_as=str(uuid4()),
        start_time=window.start.isoformat(),
        end_time=window.end.isoformat(),
        estimated_effort_minutes=effort,
        currency="USD",
        value=10,
        notified_at="2026-01-01T00:00:00+00:00",
        decision=decision,
        decided_at=None if decision is None else "2026-01-02T10:00:00+00:00",
    )


def test_overlapping_names_the_undecided_jobs_whose_window_crosses_this_one() -> None:
    undecided = {"a": monday(9, 13), "b": monday(11, 17), "c": monday(13, 14)}
    assert overlapping(monday(10, 12), undecided) == ["a", "b"]
    # Touching windows do not overlap: one ends when the other starts.
    assert overlapping(monday(13, 14), {"a": monday(9, 13)}) == []
    assert overlapping(monday(9, 17), {}) == []


def test_an_approval_that_fits_is_booked_with_the_numbers() -> None:
    judged = judge("approve", job(9, 13, 180), job_id="x", approved=[], schedule=WEEK, now=NOW)
    assert judged == Recorded(
        verdict="approve",
        outcome="booked: 180 min of work; 240 min allotted in the window, 0 already booked, "
        "240 free",
    )


def test_an_approval_beyond_the_allotted_time_is_recorded_and_says_by_how_much() -> None:
    # The human is the sole authority: the coordinator records the approval all the same.
    judged = judge(
        "approve",
        job(9, 12, 120),
        job_id="x",
        approved=[monday(9, 13, 180)],
        schedule=WEEK,
        now=NOW,
    )
    assert isinstance(judged, Recorded)
    assert judged.over_minutes == pytest.approx(75)
    assert judged.outcome.startswith("booked 75 min over the allotted time: ")


def test_a_rejection_frees_nothing() -> None:
    judged = judge("reject", job(9, 17, 60), job_id="x", approved=[], schedule=WEEK, now=NOW)
    assert judged == Recorded(
        verdict="reject", outcome="nothing booked: it held no capacity, so none is freed"
    )


@pytest.mark.parametrize(
    ("known", "code", "reason"),
    [
        (None, UNKNOWN_JOB, "no job was notified as x"),
        (job(9, 17, 60, decision="approve"), ALREADY_DECIDED, "was already approved at 2026-01-02"),
        (job(9, 17, 60, decision="reject"), ALREADY_DECIDED, "was already rejected at"),
    ],
)
def test_unknown_and_decided_jobs_are_refused(
    known: BookedJob | None, code: str, reason: str
) -> None:
    judged = judge("approve", known, job_id="x", approved=[], schedule=WEEK, now=NOW)
    assert isinstance(judged, Refusal)
    assert judged.code == code
    assert reason in judged.reason


def test_a_job_whose_window_ended_is_refused() -> None:
    late = at("2026-01-12T17:00:00+00:00")  # the very end of its window
    judged = judge("reject", job(9, 17, 60), job_id="x", approved=[], schedule=WEEK, now=late)
    assert judged == Refusal(
        code=JOB_EXPIRED, reason="job x expired: its window ended at 2026-01-12T17:00:00+00:00"
    )


def test_each_master_names_a_notification_by_one_derived_id() -> None:
    root, other_root, received = uuid4(), uuid4(), uuid4()
    assert notified_as(root, received) == notified_as(root, received)
    assert notified_as(root, received) != notified_as(other_root, received)
    assert notified_as(root, received) != notified_as(root, uuid4())


def test_a_childs_overlap_list_becomes_the_ids_the_master_notified() -> None:
    root, first, second = uuid4(), uuid4(), uuid4()
    translated = translate_overlaps([str(first), "not-an-id", 7, None, str(second)], root)
    assert translated == [str(notified_as(root, first)), str(notified_as(root, second))]
    assert [UUID(x) for x in translated]  # every one a message id
    assert translate_overlaps("not a list", root) == []
    assert len(translate_overlaps([str(uuid4()) for _ in range(500)], root)) == 100
