"""The coordinator's book of notified jobs and the human's decisions (a JSON file), and reports."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Final
from uuid import UUID

from vox_mqtt.protocol.messages import parse_timestamp

from .schedule import Booking

__all__ = ["APPROVE", "REJECT", "BookedJob", "JobBook", "Summary"]

FORMAT_VERSION: Final = 2
# Version 1 books came before decisions: their jobs are read as undecided.
READABLE_VERSIONS: Final = (1, 2)
APPROVE: Final = "approve"
REJECT: Final = "reject"
CSV_COLUMNS: Final = (
    "message_id",
    "start_time",
    "end_time",
    "estimated_effort_minutes",
    "currency",
    "value",
    "notified_at",
)


@dataclass(frozen=True, kw_only=True)
class BookedJob:
    """A job the coordinator notified to the root: scheduling and money facts, and its verdict."""

    message_id: str  # the specialist's job_detected
    forwarded_as: str  # the coordinator's job_detected to the root
    start_time: str
    end_time: str
    estimated_effort_minutes: int
    currency: str
    value: int
    notified_at: str
    decision: str | None = None  # APPROVE or REJECT once the human decided; None: undecided
    decided_at: str | None = None

    def booking(self) -> Booking:
        """Return the job as the schedule counts it."""
        return Booking(
            start=parse_timestamp(self.start_time),
            end=parse_timestamp(self.end_time),
            effort_minutes=self.estimated_effort_minutes,
        )


@dataclass(frozen=True, kw_only=True)
class Summary:
    """A financial summary: the total of jobs in one currency, and the CSV that lists them."""

    currency: str
    total: int
    jobs: int
    other_currencies: dict[str, int]
    csv_path: Path


class JobBook:
    """Jobs already notified, kept in one JSON file that is replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._jobs: dict[str, BookedJob] = {}

    def load(self) -> None:
        """Read the file if it exists; raise ValueError naming it when it is damaged."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: cannot read the job book: {exc}") from None
        if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{self.path}: not a version {FORMAT_VERSION} job book")
        try:
            jobs = [BookedJob(**row) for row in data["jobs"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{self.path}: a job entry is malformed: {exc}") from None
        self._jobs = {job.message_id: job for job in jobs}

    def __contains__(self, message_id: object) -> bool:
        return str(message_id) in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def jobs(self) -> list[BookedJob]:
        """Return the booked jobs in the order they were notified."""
        return list(self._jobs.values())

    def bookings(self) -> list[Booking]:
        """Return the approved jobs as the schedule counts them: only they hold capacity."""
        return [job.booking() for job in self._jobs.values() if job.decision == APPROVE]

    def undecided(self) -> dict[str, Booking]:
        """Return the jobs nobody decided yet, by the id they were notified to the root as."""
        return {j.forwarded_as: j.booking() for j in self._jobs.values() if j.decision is None}

    def notified_as(self, forwarded_as: str) -> BookedJob | None:
        """Return the job notified to the root under this message id, if any."""
        return next((j for j in self._jobs.values() if j.forwarded_as == forwarded_as), None)

    def add(self, job: BookedJob) -> None:
        """Book a job and write the file before returning."""
        self._jobs[job.message_id] = job
        self._write()

    def decide(self, message_id: str, verdict: str, at: str) -> BookedJob:
        """Record the human's verdict on a job and write the file before returning."""
        job = replace(self._jobs[message_id], decision=verdict, decided_at=at)
        self._jobs[message_id] = job
        self._write()
        return job

    def _write(self) -> None:
        rows = [asdict(j) for j in self._jobs.values()]
        _atomic_write(self.path, json.dumps({"version": FORMAT_VERSION, "jobs": rows}, indent=1))

    def summary(
        self, start: datetime, end: datetime, *, currency: str, request_id: UUID, reports: Path
    ) -> Summary:
        """Total the approved jobs starting in [start, end] and write them to a CSV in reports/."""
        chosen = sorted(
            (
                j
                for j in self._jobs.values()
                if j.decision == APPROVE and start <= parse_timestamp(j.start_time) <= end
            ),
            key=lambda j: (parse_timestamp(j.start_time), j.message_id),
        )
        total = sum(j.value for j in chosen if j.currency == currency)
        others: dict[str, int] = {}
        for job in chosen:
            if job.currency != currency:
                others[job.currency] = others.get(job.currency, 0) + job.value
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for job in chosen:
            writer.writerow([getattr(job, column) for column in CSV_COLUMNS])
        path = reports / f"financial_summary-{request_id}.csv"
        _atomic_write(path, buffer.getvalue())
        return Summary(
            currency=currency, total=total, jobs=len(chosen), other_currencies=others, csv_path=path
        )


def _atomic_write(path: Path, text: str) -> None:
    """Write a file so a crash leaves either the old or the new content, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
