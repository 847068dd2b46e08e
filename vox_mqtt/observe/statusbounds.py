"""The bounds a status must keep to be taken, beyond its own model's (docs/liveness.md).

Pure rules, no view: how far an epoch may jump and a clock run ahead, how fast an agent may
change what it advertises, how old a signed status may be (docs/security.md, F23), when a
status is a replay of one already taken, and when a will was published. observe/status.py
applies them to what its FleetView holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError

from vox_mqtt.protocol.messages import AgentStatus, parse_timestamp

__all__ = [
    "ADVERT_CHANGE_BURST",
    "ADVERT_CHANGE_RATE",
    "MAX_CLOCK_AHEAD",
    "MAX_EPOCH_JUMP",
    "WILL_EXPIRY",
    "ChangeBudget",
    "Timeliness",
    "clock_problem",
    "describe",
    "replayed",
    "status_age",
]

# Bounds a status must keep beyond its own model's (docs/liveness.md): an epoch moves up
# by one per connection, and no host's clock runs this far ahead of ours.
MAX_EPOCH_JUMP: Final = 1000
MAX_CLOCK_AHEAD: Final = 300.0
# How fast a watched agent may change the list of commands it advertises (docs/liveness.md):
# a burst of this many changes, then this many per second. Each change makes every master
# above it advertise anew, so a faster one is a status out of bounds.
ADVERT_CHANGE_BURST: Final = 64
ADVERT_CHANGE_RATE: Final = 0.5
# The will's MQTT message expiry (a year): the broker counts it down from the moment it
# publishes the will, so a reader of the retained will learns when the loss happened by
# the broker's clock (WILL_EXPIRY minus the expiry left), not the connect time the will's
# own emitted_at says (it is built at connect). docs/liveness.md, "The will's time".
WILL_EXPIRY: Final = 365 * 24 * 3600


@dataclass(kw_only=True)
class ChangeBudget:
    """A token bucket: `burst` changes at once, then `rate` per second (pure; clock given)."""

    burst: float = ADVERT_CHANGE_BURST
    rate: float = ADVERT_CHANGE_RATE
    tokens: float = ADVERT_CHANGE_BURST
    at: float | None = None

    def allows(self, now: float) -> bool:
        """Tell whether one more change fits now (nothing is taken)."""
        return self._refilled(now) >= 1.0

    def take(self, now: float) -> None:
        """Spend one change at now."""
        self.tokens = self._refilled(now) - 1.0
        self.at = now

    def _refilled(self, now: float) -> float:
        if self.at is None:
            return self.tokens
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)


@dataclass(frozen=True, kw_only=True)
class Timeliness:
    """How old a signed status may be by its own emitted_at (docs/security.md, F23).

    window + skew: the replay window plus the clock skew of the reader's [signing]; a status
    that says an agent lives and is older than that is never taken. skew: how far the
    sender's clock may lag ours, so a live status is aged by its emitted_at less the skew.
    """

    window: float
    skew: float


def describe(exc: ValidationError) -> str:
    """Say in one line which fields of a status broke which rule."""
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or 'status'}: {e['msg']}"
        for e in exc.errors(include_url=False)[:3]
    ]
    more = exc.error_count() - len(problems)
    return "; ".join(problems)[:500] + (f" (and {more} more)" if more > 0 else "")


def clock_problem(held_epoch: int, report: AgentStatus, emitted_at: str) -> str | None:
    """Say why a status's epoch or times cannot be believed, or None.

    held_epoch: the epoch of the status held of its agent (-1 before any).
    """
    if held_epoch >= 0 and report.epoch > held_epoch + MAX_EPOCH_JUMP:
        return (
            f"epoch jumps from {held_epoch} to {report.epoch}"
            f" (more than {MAX_EPOCH_JUMP} connections at once)"
        )
    now = datetime.now(UTC)
    for field, value in (("started_at", report.started_at), ("emitted_at", emitted_at)):
        try:
            ahead = (parse_timestamp(value) - now).total_seconds()
        except ValueError:
            return f"{field} {value[:40]!r} is not a timestamp"
        if ahead > MAX_CLOCK_AHEAD:
            return f"{field} {value} is {ahead:.0f}s ahead of this host's clock"
    return None


def status_age(emitted_at: str) -> float:
    """Return how old a status is by its own emitted_at, on this host's clock (0 if ahead)."""
    try:
        sent = parse_timestamp(emitted_at)
    except ValueError:
        return 0.0  # refused before: clock_problem checks it is a timestamp
    return max(0.0, (datetime.now(UTC) - sent).total_seconds())


def replayed(last: tuple[int, str, int] | None, report: AgentStatus) -> bool:
    """Tell whether a status is not newer than one already taken of its epoch and start.

    last: the newest (epoch, started_at, sequence) taken of its kind (full status or
    presence), or None. A broker may deliver a live agent's genuine older status again (a
    replay: its signature still holds); taken, it would show old figures or keep a frozen
    agent fresh. A status without a sequence (a will, an agent from before them) is judged
    by its epoch alone.
    """
    return (
        report.sequence is not None
        and last is not None
        and last[:2] == (report.epoch, report.started_at)
        and report.sequence <= last[2]
    )
