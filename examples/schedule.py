"""The coordinator's allotted work time: a weekly schedule and the jobs already notified."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["DAYS", "DEFAULT_WEEK", "Booking", "Fit", "WeeklySchedule"]

DAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DEFAULT_WEEK: Final[Mapping[str, list[str]]] = {day: ["09:00-17:00"] for day in DAYS[:5]}
_RANGE = re.compile(r"(\d{2}):(\d{2})-(\d{2}):(\d{2})")
_DAY: Final = 24 * 60


@dataclass(frozen=True, kw_only=True)
class Booking:
    """A job already notified: its window and the work it needs."""

    start: datetime
    end: datetime
    effort_minutes: int


@dataclass(frozen=True, kw_only=True)
class Fit:
    """Whether a job fits the allotted time, with the numbers behind the answer."""

    fits: bool
    allotted_minutes: float  # work time the schedule allots inside the job's window
    booked_minutes: float  # of that, already taken by notified jobs
    needed_minutes: int
    reason: str


class WeeklySchedule:
    """Work windows per weekday in one timezone, e.g. mon = ["09:00-12:00", "13:00-17:00"]."""

    def __init__(self, week: Mapping[str, Any] | None = None, *, timezone: str = "UTC") -> None:
        try:
            self.tz = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {timezone!r} is not an IANA zone (e.g. UTC)") from None
        self.timezone = timezone
        self.week = _parse_week(DEFAULT_WEEK if week is None else week)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> WeeklySchedule:
        """Build from role settings: work_week (a table of day -> ranges) and timezone."""
        week = settings.get("work_week")
        if week is not None and not isinstance(week, Mapping):
            raise ValueError("work_week must be a table such as {mon = ['09:00-17:00']}")
        timezone = settings.get("timezone", "UTC")
        if not isinstance(timezone, str):
            raise ValueError("timezone must be a string such as 'America/Sao_Paulo'")
        return cls(week, timezone=timezone)

    def allotted_minutes(self, start: datetime, end: datetime) -> float:
        """Return the scheduled work minutes between start and end."""
        total = 0.0
        for begin, finish in self.windows(start, end):
            total += (finish - begin).total_seconds() / 60
        return total

    def windows(self, start: datetime, end: datetime) -> Iterable[tuple[datetime, datetime]]:
        """Yield the work windows clipped to [start, end], in UTC and in order."""
        start, end = start.astimezone(UTC), end.astimezone(UTC)
        if end <= start:
            return
        day = start.astimezone(self.tz).date() - timedelta(days=1)
        last = end.astimezone(self.tz).date()
        while day <= last:
            for open_at, close_at in self.week[DAYS[day.weekday()]]:
                # Wall-clock times in the zone: a DST day has a shorter or longer window.
                begin = self._at(day, open_at).astimezone(UTC)
                finish = self._at(day, close_at).astimezone(UTC)
                begin, finish = max(begin, start), min(finish, end)
                if begin < finish:
                    yield begin, finish
            day += timedelta(days=1)

    def _at(self, day: date, minute: int) -> datetime:
        """Return the wall-clock minute of a day in the zone (1440 is the next midnight)."""
        if minute == _DAY:
            return datetime.combine(day + timedelta(days=1), time(0), self.tz)
        return datetime.combine(day, time(minute // 60, minute % 60), self.tz)

    def fit(self, job: Booking, booked: Iterable[Booking]) -> Fit:
        """Tell whether job's effort fits the allotted time its window leaves free.

        Each notified job's effort is spread evenly over the allotted time of its own
        window, so the share that falls inside the new job's window is taken.
        """
        allotted = self.allotted_minutes(job.start, job.end)
        taken = 0.0
        for other in booked:
            overlap_start, overlap_end = max(job.start, other.start), min(job.end, other.end)
            if overlap_start >= overlap_end:
                continue
            other_allotted = self.allotted_minutes(other.start, other.end)
            if other_allotted > 0:
                share = self.allotted_minutes(overlap_start, overlap_end) / other_allotted
                taken += other.effort_minutes * share
        free = allotted - taken
        fits = job.effort_minutes <= free + 1e-9
        reason = (
            f"{job.effort_minutes} min of work; {allotted:.0f} min allotted in the window, "
            f"{taken:.0f} already booked, {max(free, 0):.0f} free"
        )
        return Fit(
            fits=fits,
            allotted_minutes=allotted,
            booked_minutes=taken,
            needed_minutes=job.effort_minutes,
            reason=reason,
        )


def _parse_week(week: Mapping[str, Any]) -> dict[str, list[tuple[int, int]]]:
    unknown = sorted(set(week) - set(DAYS))
    if unknown:
        raise ValueError(f"work_week: unknown day(s) {', '.join(unknown)} (use {', '.join(DAYS)})")
    parsed: dict[str, list[tuple[int, int]]] = {}
    for day in DAYS:
        ranges = week.get(day, [])
        if isinstance(ranges, str) or not isinstance(ranges, list | tuple):
            raise ValueError(f"work_week.{day} must be a list such as ['09:00-17:00']")
        windows = sorted(_parse_range(day, text) for text in ranges)
        for (_, close_a), (open_b, _) in itertools.pairwise(windows):
            if open_b < close_a:
                raise ValueError(f"work_week.{day}: ranges overlap")
        parsed[day] = windows
    return parsed


def _parse_range(day: str, text: object) -> tuple[int, int]:
    """Return a range as minutes since midnight, e.g. '09:00-17:00' -> (540, 1020)."""
    match = _RANGE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"work_week.{day}: {text!r} is not a range such as '09:00-17:00'")
    h1, m1, h2, m2 = (int(part) for part in match.groups())
    if h1 > 23 or m1 > 59 or h2 > 24 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise ValueError(f"work_week.{day}: {text!r} is not a time of day")
    open_at, close_at = h1 * 60 + m1, h2 * 60 + m2
    if close_at <= open_at:
        raise ValueError(
            f"work_week.{day}: {text!r} ends before it starts (use 24:00 for midnight)"
        )
    return open_at, close_at
