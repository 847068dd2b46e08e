"""What a peer's messages may cost this agent's ledger: token buckets per peer.

A refused message is recorded with its reason (docs/ledger.md) and, from a peer, answered
with an error that is re-sent until acknowledged; a cancel for a request never received is
recorded and remembered. Without a bound a peer decides how many rows that costs. Within
its budget each is recorded as before; beyond it, it is counted and nothing is written
(docs/security.md, "Costs of a peer's messages").
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CANCEL_BUDGET",
    "REFUSAL_BUDGET",
    "Budget",
    "PeerBudgets",
    "TokenBucket",
]


@dataclass(frozen=True)
class Budget:
    """A rate (tokens per second) and a burst, per peer and for all peers together."""

    rate: float
    burst: float
    total_rate: float
    total_burst: float
    max_peers: int = 1024  # buckets kept; the least recently used goes first


# Refused messages recorded per peer: 32 at once, then one per 10 s (360 rows an hour at
# most, about 1.2 MB at 3.3 KB each), and 256 then one a second for all peers together.
REFUSAL_BUDGET: Final = Budget(rate=0.1, burst=32, total_rate=1.0, total_burst=256)
# Cancels for requests never received, recorded and remembered per peer: the same shape.
CANCEL_BUDGET: Final = Budget(rate=0.1, burst=32, total_rate=1.0, total_burst=256)


class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second; each take spends one."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"a bucket needs rate >= 0 and burst >= 1 (got {rate}, {burst})")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        # A clock that went back refills nothing (monotonic clocks never do; tests might).
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.stamp = max(self.stamp, now)

    def available(self, now: float) -> bool:
        """Tell whether a take now would succeed, spending nothing."""
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        """Spend one token if there is one; return whether there was."""
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def full(self, now: float) -> bool:
        """Tell whether the bucket is back to its burst (forgetting it changes nothing)."""
        self._refill(now)
        return self.tokens >= self.burst


class PeerBudgets:
    """A bucket per peer and one for all of them: a take needs a token from both.

    The shared bucket bounds the total when the peers are many (an identity with the
    broker's power writes under any name); at most `max_peers` buckets are kept, so its
    memory is bounded too. A forgotten bucket comes back full, which the shared one covers.
    """

    def __init__(self, budget: Budget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._peers: OrderedDict[str, TokenBucket] = OrderedDict()
        self._total = TokenBucket(budget.total_rate, budget.total_burst, clock())

    def allow(self, peer: str) -> bool:
        """Spend one of the peer's tokens (and one shared); False when either is out."""
        now = self._clock()
        bucket = self._peers.get(peer)
        if bucket is None:
            bucket = self._peers[peer] = TokenBucket(self.budget.rate, self.budget.burst, now)
            self._forget_some(now, keep=peer)
        else:
            self._peers.move_to_end(peer)
        # Check both before spending: a refusal by one must not spend the other's token.
        if not (bucket.available(now) and self._total.available(now)):
            return False
        return bucket.take(now) and self._total.take(now)

    def _forget_some(self, now: float, *, keep: str) -> None:
        while len(self._peers) > self.budget.max_peers:
            self._peers.popitem(last=False)
        # Full buckets hold nothing worth keeping: drop the oldest few of them.
        for peer in list(self._peers)[:8]:
            if peer != keep and self._peers[peer].full(now):
                del self._peers[peer]

    def __len__(self) -> int:
        return len(self._peers)
