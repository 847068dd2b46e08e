"""The per-peer budgets of what refusals and unknown cancels cost (agent/budget.py)."""

from __future__ import annotations

import pytest

from vox_mqtt.agent.budget import CANCEL_BUDGET, REFUSAL_BUDGET, Budget, PeerBudgets, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=0.5, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(1.0)  # half a token
    assert bucket.take(2.0)
    assert not bucket.take(2.0)
    assert bucket.full(100.0)  # refilled to the burst, never beyond it
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]


def test_a_clock_that_goes_back_refills_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)
    assert bucket.take(11.0)


def test_a_bucket_needs_a_burst_of_one() -> None:
    with pytest.raises(ValueError, match="burst >= 1"):
        TokenBucket(rate=1.0, burst=0, now=0.0)
    with pytest.raises(ValueError, match="rate >= 0"):
        TokenBucket(rate=-1.0, burst=1, now=0.0)


def test_each_peer_has_its_own_budget() -> None:
    clock = Clock()
    budgets = PeerBudgets(Budget(rate=0.1, burst=2, total_rate=10, total_burst=100), clock)
    assert [budgets.allow("a") for _ in range(3)] == [True, True, False]
    assert [budgets.allow("b") for _ in range(3)] == [True, True, False]  # a's flood spares b
    clock.now += 10
    assert budgets.allow("a")
    assert not budgets.allow("a")


def test_all_peers_together_are_bounded_by_the_shared_bucket() -> None:
    clock = Clock()
    budgets = PeerBudgets(Budget(rate=1, burst=5, total_rate=1, total_burst=10), clock)
    allowed = sum(budgets.allow(f"peer-{n}") for n in range(100))
    assert allowed == 10  # a hundred names, one budget
    clock.now += 3
    assert sum(budgets.allow(f"other-{n}") for n in range(100)) == 3


def test_a_refusal_by_the_shared_bucket_spends_nothing_of_the_peers() -> None:
    clock = Clock()
    budgets = PeerBudgets(Budget(rate=0, burst=2, total_rate=1, total_burst=1), clock)
    assert budgets.allow("a")
    assert not budgets.allow("a")  # the shared one is out: a's second token stays
    clock.now += 1
    assert budgets.allow("a")
    clock.now += 1
    assert not budgets.allow("a")  # now a's own is out


def test_memory_is_bounded_whatever_the_names() -> None:
    clock = Clock()
    budget = Budget(rate=0.1, burst=1, total_rate=1e9, total_burst=1e9, max_peers=50)
    budgets = PeerBudgets(budget, clock)
    for n in range(10_000):
        budgets.allow(f"peer-{n}")
    assert len(budgets) <= 50
    # A peer seen again stays out of tokens while it is remembered.
    assert budgets.allow("x")
    assert not budgets.allow("x")
    for n in range(10):  # full buckets of others are forgotten, never the one in use
        budgets.allow(f"late-{n}")
        clock.now += 0.01
    assert not budgets.allow("x")


def test_the_defaults_bound_an_hour() -> None:
    for budget in (REFUSAL_BUDGET, CANCEL_BUDGET):
        assert budget.burst + 3600 * budget.rate <= 400  # rows per peer and hour
        assert budget.total_burst + 3600 * budget.total_rate <= 4000
