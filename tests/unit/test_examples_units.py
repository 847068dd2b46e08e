"""The freelance example's pure logic: the intake format, the schedule and the job book."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from uuid import uuid4

import pytest

from examples.freelance import analyze_text
from examples.intake import IntakeError, parse_mail, read_mail
from examples.jobbook import BookedJob, JobBook
from examples.schedule import Booking, WeeklySchedule

GOOD = """\
From: Ana Souza <ana@netwire.example>
Subject: Translation O-26
Start: 2026-01-12T08:15:00-03:00
End: 2026-01-12T16:00:00-03:00
Effort-Minutes: 60
Price: 30 USD
X-Mailer: anything else is ignored

Client: Netwire
Project O-26-XXXXX-TRA-YYY
"""


def mail(**changes: str | None) -> str:
    """Return GOOD with headers replaced (value) or removed (None)."""
    lines = GOOD.splitlines()
    out = []
    for line in lines:
        name = line.partition(":")[0]
        key = name.replace("-", "_").lower()
        if key in changes:
            value = changes[key]
            if value is not None:
                out.append(f"{name}: {value}")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def test_a_good_mail_becomes_a_job() -> None:
    parsed = parse_mail(GOOD)
    assert parsed.sender == "ana@netwire.example"
    job = parsed.job
    assert job.start_time == "2026-01-12T08:15:00-03:00"
    assert job.end_time == "2026-01-12T16:00:00-03:00"
    assert job.estimated_effort_minutes == 60
    assert (job.price.currency, job.price.value) == ("USD", 30)
    assert job.note_to_human == (
        "Subject: Translation O-26\n\nClient: Netwire\nProject O-26-XXXXX-TRA-YYY"
    )


def test_header_names_are_case_insensitive_and_fold() -> None:
    text = GOOD.replace("Effort-Minutes", "effort-minutes").replace(
        "Subject: Translation O-26", "Subject: Translation\n  O-26"
    )
    parsed = parse_mail(text)
    assert parsed.job.estimated_effort_minutes == 60
    assert parsed.subject == "Translation O-26"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"price": None, "start": None}, "missing Start:, Price:"),
        ({"from": "nobody"}, "has no e-mail address"),
        ({"start": "2026-01-12T08:15:00"}, "has no timezone"),
        ({"end": "tomorrow"}, "is not an ISO-8601 datetime"),
        ({"price": "-30 USD"}, "is negative"),
        ({"price": "30.50 USD"}, "not a whole number of USD"),
        ({"price": "thirty"}, "'<whole amount> <currency>'"),
        ({"price": "30 usd"}, "capitals"),
        ({"effort_minutes": "0"}, "not a positive whole number"),
        ({"effort_minutes": "1h"}, "not a positive whole number"),
        ({"end": "2026-01-12T08:00:00-03:00"}, "is not after Start"),
    ],
)
def test_bad_mails_say_what_is_wrong(changes: dict[str, str | None], reason: str) -> None:
    with pytest.raises(IntakeError) as failure:
        parse_mail(mail(**changes))
    assert reason in str(failure.value)
    assert "\n" not in str(failure.value)


def test_structure_errors() -> None:
    with pytest.raises(IntakeError, match="line 2 is not a 'Name: value' header"):
        parse_mail("From: a@b.example\nthis is the body without a blank line\n")
    with pytest.raises(IntakeError, match="Price: appears 2 times"):
        parse_mail(GOOD.replace("Price: 30 USD", "Price: 30 USD\nPrice: 40 USD"))


def test_read_mail_refuses_binary_and_big_files(tmp_path: Path) -> None:
    binary = tmp_path / "binary.eml"
    binary.write_bytes(b"From: \xff\xfe\n")
    with pytest.raises(IntakeError, match="not UTF-8"):
        read_mail(binary)
    big = tmp_path / "big.eml"
    big.write_text(GOOD + "x" * 70_000)
    with pytest.raises(IntakeError, match="over 65536 bytes"):
        read_mail(big)
    with pytest.raises(IntakeError, match="cannot read"):
        read_mail(tmp_path / "absent.eml")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def booking(start: str, end: str, effort: int) -> Booking:
    return Booking(start=at(start), end=at(end), effort_minutes=effort)


def test_allotted_minutes_follow_the_week_and_the_zone() -> None:
    week = WeeklySchedule({"mon": ["09:00-12:00", "13:00-17:00"]}, timezone="America/Sao_Paulo")
    # Monday 2026-01-12 in Sao Paulo (UTC-3): 7 h of work.
    assert week.allotted_minutes(at("2026-01-12T00:00-03:00"), at("2026-01-13T00:00-03:00")) == 420
    # Seen from UTC: 12:00-17:00 UTC is 09:00-14:00 there, lunch excluded.
    assert week.allotted_minutes(at("2026-01-12T12:00+00:00"), at("2026-01-12T17:00+00:00")) == 240
    # Tuesday has no work time.
    assert week.allotted_minutes(at("2026-01-13T00:00-03:00"), at("2026-01-14T00:00-03:00")) == 0


def test_a_full_day_and_midnight() -> None:
    week = WeeklySchedule({"sat": ["00:00-24:00"]})
    assert week.allotted_minutes(at("2026-01-17T00:00+00:00"), at("2026-01-19T00:00+00:00")) == 1440


def test_fit_counts_jobs_already_notified() -> None:
    week = WeeklySchedule()  # Monday to Friday, 09:00-17:00 UTC
    job = booking("2026-01-12T09:00+00:00", "2026-01-12T17:00+00:00", 300)
    assert week.fit(job, []).fits
    other = booking("2026-01-12T09:00+00:00", "2026-01-12T17:00+00:00", 200)
    verdict = week.fit(job, [other])
    assert not verdict.fits
    assert verdict.allotted_minutes == 480
    assert verdict.booked_minutes == 200
    assert "280 free" in verdict.reason
    # A booked job spread over two days takes only half its effort from Monday.
    two_days = booking("2026-01-12T09:00+00:00", "2026-01-13T17:00+00:00", 200)
    assert week.fit(job, [two_days]).booked_minutes == 100
    assert week.fit(job, [two_days]).fits


def test_a_weekend_job_does_not_fit_a_weekday_schedule() -> None:
    saturday = booking("2026-01-17T09:00+00:00", "2026-01-17T17:00+00:00", 30)
    verdict = WeeklySchedule().fit(saturday, [])
    assert not verdict.fits
    assert verdict.allotted_minutes == 0


@pytest.mark.parametrize(
    ("week", "timezone", "reason"),
    [
        ({"monday": ["09:00-17:00"]}, "UTC", "unknown day"),
        ({"mon": "09:00-17:00"}, "UTC", "must be a list"),
        ({"mon": ["9-17"]}, "UTC", "is not a range"),
        ({"mon": ["17:00-09:00"]}, "UTC", "ends before it starts"),
        ({"mon": ["09:00-12:00", "11:00-13:00"]}, "UTC", "overlap"),
        ({"mon": ["25:00-26:00"]}, "UTC", "not a time of day"),
        (None, "Mars/Olympus", "not an IANA zone"),
    ],
)
def test_bad_schedules_are_refused(
    week: dict[str, object] | None, timezone: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        WeeklySchedule(week, timezone=timezone)


def booked(
    start: str, value: int, currency: str = "USD", decision: str | None = "approve"
) -> BookedJob:
    return BookedJob(
        message_id=str(uuid4()),
        forwarded_as=str(uuid4()),
        start_time=start,
        end_time=start.replace("T09", "T17"),
        estimated_effort_minutes=60,
        currency=currency,
        value=value,
        notified_at="2026-01-01T00:00:00+00:00",
        decision=decision,
        decided_at=None if decision is None else "2026-01-02T00:00:00+00:00",
    )


def test_job_book_persists_and_sums_a_range_of_approved_jobs(tmp_path: Path) -> None:
    book = JobBook(tmp_path / "jobs.json")
    book.add(booked("2026-01-05T09:00:00+00:00", 30))
    book.add(booked("2026-01-20T09:00:00+00:00", 45))
    book.add(booked("2026-01-21T09:00:00+00:00", 10, "EUR"))
    book.add(booked("2026-02-02T09:00:00+00:00", 1000))
    # Undecided and rejected jobs are in the book but in no total.
    book.add(booked("2026-01-06T09:00:00+00:00", 7, decision=None))
    book.add(booked("2026-01-07T09:00:00+00:00", 8, decision="reject"))
    again = JobBook(tmp_path / "jobs.json")
    again.load()
    assert len(again) == 6
    request = uuid4()
    summary = again.summary(
        at("2026-01-01T00:00:00+00:00"),
        at("2026-01-31T23:59:59+00:00"),
        currency="USD",
        request_id=request,
        reports=tmp_path / "reports",
    )
    assert (summary.total, summary.jobs) == (75, 3)
    assert summary.other_currencies == {"EUR": 10}
    assert summary.csv_path == tmp_path / "reports" / f"financial_summary-{request}.csv"
    rows = list(csv.DictReader(summary.csv_path.read_text().splitlines()))
    assert [row["value"] for row in rows] == ["30", "45", "10"]
    assert "note_to_human" not in summary.csv_path.read_text()


def test_only_approved_jobs_hold_capacity_and_a_verdict_is_kept(tmp_path: Path) -> None:
    book = JobBook(tmp_path / "jobs.json")
    undecided = booked("2026-01-05T09:00:00+00:00", 30, decision=None)
    book.add(undecided)
    book.add(booked("2026-01-06T09:00:00+00:00", 40, decision="reject"))
    assert book.bookings() == []
    assert list(book.undecided()) == [undecided.forwarded_as]
    assert book.notified_as(undecided.forwarded_as) == undecided
    assert book.notified_as(str(uuid4())) is None
    decided = book.decide(undecided.message_id, "approve", "2026-01-03T00:00:00+00:00")
    assert (decided.decision, decided.decided_at) == ("approve", "2026-01-03T00:00:00+00:00")
    again = JobBook(tmp_path / "jobs.json")
    again.load()
    assert again.bookings() == [undecided.booking()]
    assert again.undecided() == {}


def test_a_version_1_job_book_is_read_as_undecided_jobs(tmp_path: Path) -> None:
    row = asdict(booked("2026-01-05T09:00:00+00:00", 30))
    del row["decision"], row["decided_at"]
    (tmp_path / "jobs.json").write_text(json.dumps({"version": 1, "jobs": [row]}))
    book = JobBook(tmp_path / "jobs.json")
    book.load()
    (job,) = book.jobs()
    assert job.decision is None
    assert book.bookings() == []


def test_a_damaged_job_book_is_named(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"jobs\.json: cannot read the job book"):
        JobBook(path).load()


def test_analyze_text_is_deterministic() -> None:
    first = analyze_text("invoice.pdf")
    assert first == analyze_text("invoice.pdf")
    assert first["kind"] == "file name (.pdf)"
    assert analyze_text("ana@netwire.example")["kind"] == "e-mail address"
    assert analyze_text("https://example.org/x")["kind"] == "url"
    assert analyze_text("two words")["words"] == 2
