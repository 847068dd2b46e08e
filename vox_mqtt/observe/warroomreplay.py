"""Replayed war-room posts: refused by age, ignored when not newer (docs/security.md, replays).

A signature proves who posted and that the post is unchanged, not that it is new: a broker
that kept a genuine "open" post could publish it again after the incident was resolved.
Two rules make that harmless, for every war-room reader (`apply_warroom`):

- a *signed* post emitted longer ago than the replay window plus the clock skew (or
  further ahead than the skew) is refused `STALE`: the poster re-posts each incident it
  holds open well within the window (`WarroomPoster.refresh`), so a genuine open incident
  is never that old;
- a post about a (source, subject) that is not newer than the newest already taken for
  it is ignored: a replayed "open" cannot undo the resolution that followed it.

Newer is judged by the post's signed `emitted_at`, not by a sequence: the poster's wall
clock survives its restarts (a counter would need the poster's epoch beside it, kept on
disk, and a field of the contract's system_failure), and the STALE rule already relies on
the clocks agreeing within the skew. A poster whose clock steps back by more than the gap
between two of its posts has its later post ignored until the next refresh re-posts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

from vox_mqtt.protocol.messages import parse_timestamp
from vox_mqtt.protocol.signing import CLOCK_SKEW, REPLAY_WINDOW, replay_problem

__all__ = ["NOT_NEWER", "WarroomOrder", "refresh_due"]

# Why a post is ignored: not newer than the newest taken about its (source, subject).
NOT_NEWER: Final = "NOT_NEWER"


def refresh_due(posted_at: float, now: float, window: float) -> bool:
    """Return whether a retained open post made at posted_at must be posted again now.

    At half the window: a reader then never holds a genuine open post older than the
    window, even if one refresh is late by a heartbeat or lost in an outage.
    """
    return now - posted_at >= window / 2


@dataclass
class WarroomOrder:
    """Judge war-room posts against the replay window and the newest post taken per topic."""

    window: float = REPLAY_WINDOW
    skew: float = CLOCK_SKEW
    newest: dict[tuple[UUID, UUID], tuple[float, bool]] = field(default_factory=dict)

    def judge(
        self,
        key: tuple[UUID, UUID],
        emitted_at: str,
        *,
        signed: bool,
        now: float,
        resolved: bool = False,
    ) -> str | None:
        """Return why a post must not be taken (reason first: STALE or NOT_NEWER), or None.

        Taking it (None) records its time as the newest about key. An unsigned post (the
        "accept" and "off" modes) is not judged by its age, as its emitted_at proves
        nothing, but it is still ordered. Of two posts emitted in the same millisecond the
        resolution is the newer: an incident opened and resolved at once ends resolved.
        """
        if signed:
            stale = replay_problem(emitted_at, now, self.window, self.skew)
            if stale is not None:
                return stale
        try:
            at = parse_timestamp(emitted_at).timestamp()
        except ValueError:
            return f"{NOT_NEWER}: emitted_at {emitted_at[:40]!r} is not a time"
        last = self.newest.get(key)
        if last is not None and (at, resolved) <= last:
            # The same post again (a retained copy re-sent at a resubscribe) or an older
            # one: what it says was already taken, or superseded.
            return f"{NOT_NEWER}: emitted {last[0] - at:.3f} s before the newest post taken"
        self.newest[key] = (at, resolved)
        return None
