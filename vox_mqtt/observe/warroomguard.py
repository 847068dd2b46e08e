"""What a war-room post may be, checked by whoever receives it.

The broker already refuses a post about anyone but the poster and its own children
(docs/broker.md); receivers check again, because an ACL can be hand-edited or a broker
rendered by an older version: a post must be small, about its source or one of the
source's children, and no source may post faster than a steady trickle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

__all__ = [
    "WARROOM_MAX_BYTES",
    "WarroomGuard",
    "rule_problem",
]

# A system_failure post is a few hundred bytes; this leaves room for a long description.
WARROOM_MAX_BYTES: Final = 16 * 1024
# Each source may post a burst of this many, then one per RATE_INTERVAL seconds.
RATE_BURST: Final = 20
RATE_INTERVAL: Final = 1.0

MasterOf = Callable[[UUID], "UUID | None"]


def rule_problem(source: UUID, subject: UUID, master_of: MasterOf) -> str | None:
    """Return why a post by source about subject breaks the war-room rule, or None.

    master_of(subject) is the subject's master as the receiver knows it, None when it
    does not know (then only the broker's ACL can tell, and the post is let through).
    """
    if subject == source:
        return None
    master = master_of(subject)
    if master is None or master == source:
        return None
    return f"posted by {source} about {subject}, which is neither itself nor its child"


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class WarroomGuard:
    """Admit war-room posts: size, the self-or-child rule, and a rate per source."""

    max_bytes: int = WARROOM_MAX_BYTES
    burst: int = RATE_BURST
    interval: float = RATE_INTERVAL
    clock: Callable[[], float] = time.monotonic
    dropped: int = 0
    _buckets: dict[UUID, _Bucket] = field(default_factory=dict)

    def refuse(self, source: UUID, subject: UUID, size: int, master_of: MasterOf) -> str | None:
        """Return why this post must be dropped (and count it), or None to take it."""
        reason = self._reason(source, subject, size, master_of)
        if reason is not None:
            self.dropped += 1
        return reason

    def _reason(self, source: UUID, subject: UUID, size: int, master_of: MasterOf) -> str | None:
        if size > self.max_bytes:
            return f"post by {source} is {size} bytes (at most {self.max_bytes})"
        problem = rule_problem(source, subject, master_of)
        if problem is not None:
            return problem
        now = self.clock()
        bucket = self._buckets.setdefault(source, _Bucket(tokens=float(self.burst), at=now))
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.interval)
        bucket.at = now
        if bucket.tokens < 1.0:
            return f"{source} posts faster than one per {self.interval:g} s"
        bucket.tokens -= 1.0
        return None
