"""What a compromised leaf may publish under its own name, bounded: numbers, shares, rates.

The pure parts of docs/liveness.md's bounds: `metrics_problem`, the FleetView's refusals
(numbers, a child's share, how fast it changes its commands), the master's fair
advertisement, the witness's rate and the exporter's war-room series.
"""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID, uuid4

import pytest

from vox_mqtt.agent.rules import MIN_CHILD_SHARE, advertisement, child_share
from vox_mqtt.console.exporter import INVALID_CODE, code_label, warroom_series
from vox_mqtt.ledger.witness import WITNESS_BURST, RateBudget
from vox_mqtt.observe.metricbounds import metrics_problem
from vox_mqtt.observe.metrics import parse_host_metrics, parse_snapshot
from vox_mqtt.observe.status import FleetView
from vox_mqtt.observe.statusbounds import ADVERT_CHANGE_BURST, ChangeBudget
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, VOXMessage, new_message

AGENT = uuid4()
MASTER = uuid4()
HUGE = 10**400  # valid JSON; float(HUGE) raises OverflowError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(
    epoch: int = 1,
    *,
    commands: list[str] | None = None,
    metrics: dict[str, Any] | None = None,
    source: UUID = AGENT,
) -> VOXMessage:
    report = AgentStatus(
        name="spec",
        status="ACTIVE",
        epoch=epoch,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        commands=["analyze"] if commands is None else commands,
        metrics=metrics or {},
    )
    return new_message(MSG_AGENT_STATUS, source=source, target=MASTER, details=report)


def snapshot(**parts: Any) -> dict[str, Any]:
    return {"agent": {"v": 1, **parts}}


def timing(le: Any, counts: Any, total: Any) -> dict[str, Any]:
    histogram = {"le": le, "counts": counts, "sum": total}
    return snapshot(histograms={"ledger_commit_seconds": histogram})


# --- numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metrics",
    [
        {"cpu_percent": HUGE},
        {"cpu_percent": math.nan},
        {"memory_percent": math.inf},
        {"disk_percent": 101},
        {"load_1m": -1},
        {"process_rss_bytes": 2**64},
        {"uptime_s": 1e11},
        snapshot(gauges={"ledger_bytes": HUGE}),
        snapshot(gauges={"intake_queue": -3}),
        snapshot(counters={"duplicates": HUGE}),
        snapshot(counters={"messages_in": {"command_request": -1}}),
        snapshot(counters={"resends": 1.5}),
        snapshot(
            histograms={"ledger_commit_seconds": {"le": [0.1], "counts": [1, 1], "sum": HUGE}}
        ),
        snapshot(histograms={"ledger_commit_seconds": {"le": [HUGE], "counts": [1, 1], "sum": 1}}),
        snapshot(
            histograms={"ledger_commit_seconds": {"le": [0.1], "counts": [HUGE, 1], "sum": 1}}
        ),
        snapshot(messages_per_s=HUGE),
        # One bad number among good ones, where a min and max alone would miss it.
        timing([0.1, math.nan, 0.5], [1, 1, 1, 1], 1),
        timing([math.inf, 0.1], [1, 1, 1], 1),
        timing([0.1, 0.2], [1, 2.0, 3], 1),
        timing([0.1, 0.2], [1, 2**63, 3], 1),
        snapshot(counters={"messages_in": {"a": 1, "b": 2.5}, "duplicates": 1}),
        snapshot(counters={"messages_in": {"a": 1}, "commands_failed": {"X": 2**63}}),
    ],
)
def test_a_number_out_of_its_range_is_a_problem_and_parses_to_nothing(
    metrics: dict[str, Any],
) -> None:
    problem = metrics_problem(metrics)
    assert problem is not None
    assert "outside" in problem or "not a whole count" in problem
    assert len(problem) < 200  # a huge value is named, never printed
    # The lenient parsers never raise on it and keep nothing of it.
    parse_host_metrics(metrics)
    parse_snapshot(metrics.get("agent"))


def test_ordinary_figures_and_what_is_not_a_number_are_no_problem() -> None:
    assert metrics_problem({}) is None
    assert metrics_problem(None) is None
    fine = {
        "cpu_percent": 12.5,
        "memory_percent": 40,
        "disk_percent": 100.0,
        "load_1m": 0.3,
        "process_rss_bytes": 80 * 2**20,
        "process_cpu_percent": 230.0,  # more than one core
        "uptime_s": 86400,
        "version": "x" * 40,  # unknown names are not read
        "memory_total": HUGE,
        **snapshot(
            counters={"duplicates": 3, "messages_in": {"x": 1}}, gauges={"ledger_bytes": 1e9}
        ),
    }
    assert metrics_problem(fine) is None
    assert metrics_problem({"cpu_percent": "high"}) is None  # not a number: left out
    # Among numbers within bounds, what is not a number is left out too; the edges hold.
    assert metrics_problem(timing([0.1, "x", None], [True, 1, None, 2**63 - 1], 0)) is None
    assert metrics_problem(snapshot(counters={"messages_in": {"a": None, "b": 0}})) is None
    assert metrics_problem(timing([], [], 0.0)) is None
    assert parse_host_metrics({"cpu_percent": HUGE, "load_1m": 1.0}) == {"load_1m": 1.0}


def test_the_problem_names_the_first_bad_number_where_it_is() -> None:
    problem = metrics_problem(timing([0.1, 0.2], [1, 2.5, -1], 1))
    assert problem == (
        "metrics.agent.histograms.ledger_commit_seconds.counts = 2.5 is not a whole count"
    )
    problem = metrics_problem(snapshot(counters={"rejected": {"A": 1, "B": -4}}))
    assert problem == "metrics.agent.counters.rejected = -4 is outside [0, 9.22337e+18]"
    problem = metrics_problem(timing([0.1, 2e10], [1, 1, 1], 1))
    assert problem == (
        "metrics.agent.histograms.ledger_commit_seconds.le = 20000000000.0 is outside [0, 1e+10]"
    )


def test_a_status_out_of_bounds_is_refused_whole_and_the_agent_is_marked() -> None:
    refused: list[str] = []
    view = FleetView()
    view.add_reject_listener(lambda _entry, why: refused.append(why))
    assert view.update(status(metrics={"cpu_percent": HUGE})) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert not entry.seen  # never believed ...
    assert entry.misbehaving()  # ... but marked, so a view lists it as rejected
    assert entry.rejected is not None
    assert "metrics.cpu_percent" in entry.rejected
    assert entry.as_dict()["rejected"] == entry.rejected
    assert len(refused) == 1
    # Another agent's status is untouched.
    other = uuid4()
    view.update(status(source=other))
    other_entry = view.get(other)
    assert other_entry is not None
    assert other_entry.healthy


# --- a child's share and rate -------------------------------------------------------------


def test_the_share_splits_the_room_evenly_with_a_floor() -> None:
    assert child_share(0, 1, 256) == 256
    assert child_share(0, 2, 256) == 128
    assert child_share(6, 2, 256) == 125
    assert child_share(0, 100, 256) == MIN_CHILD_SHARE
    assert child_share(300, 2, 256) == MIN_CHILD_SHARE


def test_a_child_over_its_share_is_refused_and_its_sibling_stays() -> None:
    sibling = uuid4()
    view = FleetView()
    view.share_of = lambda agent: 128 if agent in (AGENT, sibling) else None
    view.update(status(commands=["analyze"], source=sibling))
    flood = [f"a{i:03d}" for i in range(256)]
    assert view.update(status(commands=flood)) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.misbehaving()
    assert "more than its share of 128" in (entry.rejected or "")
    assert view.commands_by([AGENT, sibling]) == {sibling: ("analyze",)}
    # Within its share it is believed.
    other = uuid4()
    view.update(status(commands=flood[:128], source=other))
    assert not (view.get(other) or entry).misbehaving()


def test_commands_changed_faster_than_the_budget_are_refused() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    view.update(status(commands=["c0"]))
    for n in range(1, ADVERT_CHANGE_BURST + 1):
        assert view.update(status(commands=[f"c{n}"])) is None  # same state: no change event
        entry = view.get(AGENT)
        assert entry is not None
        assert not entry.misbehaving(), n
    view.update(status(commands=["again"]))
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.misbehaving()
    assert "changes its commands faster" in (entry.rejected or "")
    assert entry.commands == (f"c{ADVERT_CHANGE_BURST}",)  # the refused list never applied


def test_the_same_list_again_and_a_restart_are_no_change() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    for epoch in range(1, 200):
        view.update(status(epoch, commands=["analyze"]))
    entry = view.get(AGENT)
    assert entry is not None
    assert not entry.misbehaving()


def test_the_change_budget_refills_at_its_rate() -> None:
    budget = ChangeBudget(burst=2, rate=0.5, tokens=2)
    assert budget.allows(0.0)
    budget.take(0.0)
    budget.take(0.0)
    assert not budget.allows(1.0)
    assert budget.allows(2.0)  # one more every 2 s
    budget.take(2.0)
    assert not budget.allows(3.9)


def test_the_advertisement_keeps_every_child_a_fair_part() -> None:
    a, b = UUID(int=1), UUID(int=2)
    flood = tuple(f"a{i:03d}" for i in range(256))
    chosen, cut = advertisement({"own"}, {a: flood, b: ("analyze",)}, 256)
    assert "analyze" in chosen
    assert "own" in chosen
    assert len(chosen) == 256
    assert cut == 256 - 254
    chosen, cut = advertisement(set(), {a: ("x", "y"), b: ("y", "z")}, 256)
    assert (chosen, cut) == (["x", "y", "z"], 0)
    assert advertisement(set(), {}, 256) == ([], 0)


# --- the witness and the war-room series --------------------------------------------------


def test_the_witness_budget_allows_a_burst_then_its_rate() -> None:
    budget = RateBudget(WITNESS_BURST, 1.0)
    assert sum(budget.take(0.0) for _ in range(5000)) == WITNESS_BURST
    assert budget.take(1.0)
    assert not budget.take(1.5)


def test_war_room_codes_are_bounded_labels_that_expire() -> None:
    assert code_label("VM_CONNECTION_LOST") == "VM_CONNECTION_LOST"
    assert code_label("X" * 15_000) == INVALID_CODE
    assert code_label("[/]\x1b") == INVALID_CODE
    remembered: dict[tuple[str, str], float] = {}
    pair = ("ERROR", "DISK_FULL")
    assert warroom_series({pair: 1}, remembered, 0.0, keep=10) == {pair: 1}
    assert warroom_series({}, remembered, 5.0, keep=10) == {pair: 0}  # resolved: reads 0
    assert warroom_series({}, remembered, 16.0, keep=10) == {}  # then it goes
    assert remembered == {}
    # Beyond the cap, the longest closed go first; new pairs are always tracked.
    for n in range(5):
        warroom_series({("ERROR", f"C{n}"): 1}, remembered, float(n), keep=100, cap=3)
    series = warroom_series({("ERROR", "NEW"): 2}, remembered, 10.0, keep=100, cap=3)
    assert series == {
        ("ERROR", "NEW"): 2,
        ("ERROR", "C2"): 0,
        ("ERROR", "C3"): 0,
        ("ERROR", "C4"): 0,
    }
