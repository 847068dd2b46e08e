"""Storm control's rules (protocol/storm.py): spread, backoff, the grace after a reconnect."""

from __future__ import annotations

import random

import pytest

from vox_mqtt.protocol.storm import (
    BRIDGE_RESTART_BASE,
    BRIDGE_RESTART_CAP,
    CONNECTS_PER_SECOND,
    MIN_SPREAD,
    RECONNECT_MAX,
    SETTLE,
    backoff_window,
    bridge_restart_timeout,
    child_silence,
    hold_loss,
    reconnect_cap,
    reconnect_grace,
    reconnect_spread,
)


def test_the_spread_grows_with_the_agents_on_the_broker() -> None:
    assert reconnect_spread(0) == MIN_SPREAD
    assert reconnect_spread(100) == MIN_SPREAD  # a small broker gains nothing from waiting
    assert reconnect_spread(1_000) == pytest.approx(1_000 / CONNECTS_PER_SECOND)
    assert reconnect_spread(10_000) == pytest.approx(20.0)
    assert reconnect_spread(-5) == MIN_SPREAD
    # The cap is never below the spread: a huge broker's first window is not cut short.
    assert reconnect_cap(MIN_SPREAD) == RECONNECT_MAX
    assert reconnect_cap(50.0) == 50.0


def test_births_reach_the_broker_at_the_rate_on_average() -> None:
    """Draws uniform within the spread: about CONNECTS_PER_SECOND births in any second."""
    agents = 5_000
    spread = reconnect_spread(agents)
    rng = random.Random(7)
    moments = [rng.uniform(0, spread) for _ in range(agents)]
    per_second = [sum(1 for m in moments if s <= m < s + 1) for s in range(int(spread))]
    assert max(per_second) <= CONNECTS_PER_SECOND * 1.15
    assert min(per_second) >= CONNECTS_PER_SECOND * 0.85


def test_the_backoff_doubles_from_the_spread_up_to_its_cap() -> None:
    assert [backoff_window(0.5, n, 30.0) for n in range(8)] == [
        0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0
    ]  # fmt: skip
    assert backoff_window(2.0, 0, 30.0) == 2.0  # the first try: within the spread
    assert backoff_window(0.5, 10_000, 30.0) == 30.0  # no overflow after a long outage
    assert backoff_window(0.5, -1, 30.0) == 0.5


def test_bridges_retry_from_one_second_up_to_a_cap_sized_like_the_spread() -> None:
    assert bridge_restart_timeout(0) == (BRIDGE_RESTART_BASE, BRIDGE_RESTART_CAP)
    assert bridge_restart_timeout(300) == (1, 10)
    assert bridge_restart_timeout(10_000) == (1, 20)
    assert bridge_restart_timeout(10_001) == (1, 21)  # whole seconds, rounded up


def test_the_grace_is_the_window_plus_a_heartbeat_plus_settling() -> None:
    assert reconnect_grace(0.5, 5.0) == 0.5 + 5.0 + SETTLE


def test_a_child_may_stay_unheard_its_backoff_cap_then_as_long_as_any_agent_may() -> None:
    # Heartbeat 15 s, stale after 3, cap 30 s: a minute and a quarter after the broker is
    # back, enough for a host that reborn a thousand agents in about a minute (figure 16).
    assert child_silence(15.0, 3.0, 30.0) == 30.0 + 45.0
    assert reconnect_grace(2.0, child_silence(15.0, 3.0, 30.0)) == 2.0 + 75.0 + SETTLE


def held(now: float, seen_at: float, reconnected_at: float | None = 100.0) -> bool:
    return hold_loss(
        now=now, seen_at=seen_at, reconnected_at=reconnected_at, window=4.0, heard_within=5.0
    )


def test_a_loss_seen_within_the_grace_after_a_reconnect_waits_for_its_end() -> None:
    end = 100.0 + reconnect_grace(4.0, 5.0)
    # The restored will of a child that is reborn a moment later: held, then gone.
    assert held(now=103.0, seen_at=103.0)
    assert held(now=end - 0.01, seen_at=103.0)
    # Not back by the end of the grace: posted then.
    assert not held(now=end, seen_at=103.0)
    # Seen after the grace: a loss like any other, at once.
    assert not held(now=end + 1, seen_at=end + 0.5)


def test_no_hold_without_a_reconnect_or_for_what_came_before_it() -> None:
    assert not held(now=101.0, seen_at=101.0, reconnected_at=None)  # first connection
    # Seen before our reconnect: not this rule's (the old-news rule decides it).
    assert not held(now=101.0, seen_at=99.0)
