"""The heartbeat's cadence: one beat per interval, whenever within its tick each is sent.

A pure rule for the liveness loop (docs/liveness.md, "The status topic").
"""

from __future__ import annotations

__all__ = ["next_heartbeat"]


def next_heartbeat(due: float, now: float, interval: float) -> float:
    """Return when the beat after the one due at `due` (and sent at `now`) is due.

    Counting from when a beat was sent would add the tick's wait (up to a second) to every
    interval: a fleet's statuses would arrive a few percent slower than agents / interval.
    A beat held past a whole interval (a stalled loop) starts the cadence again from now
    rather than sending the missed beats at once.
    """
    following = due + interval
    return following if following > now else now + interval
