"""F25: a child's events bounded by a rate and a backlog; copies to a silent peer held back."""

from __future__ import annotations

from uuid import uuid4

from vox_mqtt.agent.childbudget import REPORT_EVERY, ChildBudgets, flood_problem
from vox_mqtt.agent.quietpeers import QUIET_RESENDS, QuietPeers

CHILD, OTHER, PEER = uuid4(), uuid4(), uuid4()


def test_flood_problem_names_the_limit_a_child_is_over() -> None:
    assert flood_problem(in_work=0, backlog=5, rate_allows=True, rate=2.0) is None
    backlog = flood_problem(in_work=5, backlog=5, rate_allows=True, rate=2.0)
    assert backlog is not None
    assert "child_backlog 5" in backlog
    rate = flood_problem(in_work=0, backlog=5, rate_allows=False, rate=2.0)
    assert rate is not None
    assert "faster than 2 a second" in rate


def test_a_burst_then_the_rate_and_one_report_per_interval() -> None:
    budgets = ChildBudgets()
    taken = [budgets.admit(CHILD, now=0.0, rate=2.0, backlog=5) for _ in range(8)]
    assert [p is None for p, _ in taken] == [True] * 5 + [False] * 3
    assert [report for _, report in taken[5:]] == [True, False, False]  # posted once
    # A sibling is not touched by it.
    assert budgets.admit(OTHER, now=0.0, rate=2.0, backlog=5) == (None, False)
    # Half a second later one more token: taken.
    assert budgets.admit(CHILD, now=0.5, rate=2.0, backlog=5)[0] is None
    problem, report = budgets.admit(CHILD, now=0.5 + REPORT_EVERY, rate=2.0, backlog=5)
    assert problem is None  # refilled by then
    assert not report
    for _ in range(4):  # the rest of the refilled burst
        assert budgets.admit(CHILD, now=0.5 + REPORT_EVERY, rate=2.0, backlog=5)[0] is None
    assert budgets.admit(CHILD, now=0.5 + REPORT_EVERY, rate=2.0, backlog=5)[1]  # again


def test_the_backlog_counts_work_until_it_is_done() -> None:
    budgets = ChildBudgets()
    for _ in range(3):
        budgets.started(CHILD)
    assert budgets.admit(CHILD, now=0.0, rate=100.0, backlog=3)[0] is not None
    budgets.finished(CHILD)
    assert budgets.in_work(CHILD) == 2
    assert budgets.admit(CHILD, now=0.0, rate=100.0, backlog=3)[0] is None
    for _ in range(2):
        budgets.finished(CHILD)
    assert budgets.in_work(CHILD) == 0


def test_a_silent_peer_gets_a_few_copies_and_then_only_answers() -> None:
    quiet = QuietPeers()
    one = quiet.new(PEER)
    key = uuid4()
    # The first copy and QUIET_RESENDS re-sends go; the next re-send is held.
    assert not quiet.holds(PEER, key, one, answer=False, resend=False, limit=100)
    quiet.published(PEER, one, resend=False)
    for _ in range(QUIET_RESENDS):
        assert not quiet.holds(PEER, key, one, answer=False, resend=True, limit=100)
        quiet.published(PEER, one, resend=True)
    assert quiet.holds(PEER, key, one, answer=False, resend=True, limit=100)
    # Heard from: the held one comes back, and may be sent again.
    assert quiet.heard(PEER) == {key}
    assert not quiet.holds(PEER, key, one, answer=False, resend=True, limit=100)


def test_beyond_the_limit_of_publishes_only_answers_go_to_a_silent_peer() -> None:
    quiet = QuietPeers()
    for _ in range(3):
        copy = quiet.new(PEER)
        assert not quiet.holds(PEER, uuid4(), copy, answer=False, resend=False, limit=3)
        quiet.published(PEER, copy, resend=False)
    event, answer = quiet.new(PEER), quiet.new(PEER)
    assert quiet.holds(PEER, uuid4(), event, answer=False, resend=False, limit=3)
    assert not quiet.holds(PEER, uuid4(), answer, answer=True, resend=False, limit=3)
    quiet.heard(PEER)
    assert not quiet.holds(PEER, uuid4(), quiet.new(PEER), answer=False, resend=False, limit=3)
