"""Where a request stands, from rows and times (agent/standing.py): pure, every branch."""

from __future__ import annotations

from typing import Any

import pytest

from vox_mqtt.agent.standing import history_of, part_of, progress_delay
from vox_mqtt.protocol.lifecycle import MAX_HISTORY

ME, CHILD = "me", "child"


def row(action: str, at: str, target: str = ME) -> dict[str, Any]:
    return {"action": action, "recorded_at": at, "target": target}


def test_rows_become_states_in_order_and_only_this_agents_count() -> None:
    rows = [
        row("received", "t1"),
        row("duplicate", "t2"),  # not a state
        row("started", "t3"),
        row("sent", "t4", target=CHILD),  # a copy sent on: not this agent's part
        row("canceled", "t5"),
    ]
    assert history_of(rows, ME) == [
        {"state": "received", "at": "t1"},
        {"state": "working", "at": "t3"},
        {"state": "canceled", "at": "t5"},
    ]


def test_a_part_says_the_last_state_since_when_and_the_history() -> None:
    rows = [row("received", "t1"), row("delegated", "t2")]
    assert part_of(rows, [], ME) == {
        "state": "delegated",
        "since": "t2",
        "history": [{"state": "received", "at": "t1"}, {"state": "delegated", "at": "t2"}],
    }


def test_a_long_history_keeps_its_newest_entries() -> None:
    rows = [row("received", f"t{n}") for n in range(MAX_HISTORY + 5)]
    part = part_of(rows, [], ME)
    assert len(part["history"]) == MAX_HISTORY
    assert part["history"][-1]["at"] == f"t{MAX_HISTORY + 4}"


def test_a_request_never_received_is_unknown_or_canceled_before_it_came() -> None:
    assert part_of([], [], ME) == {"state": "unknown"}
    cancels = [row("received", "t9")]
    assert part_of([], cancels, ME) == {"state": "canceled", "since": "t9"}
    assert part_of([row("rejected", "t1", target=CHILD)], [], ME) == {"state": "unknown"}


@pytest.mark.parametrize(
    ("now", "last", "waiting", "expected"),
    [
        (10.0, 9.0, False, None),  # the window is open: now
        (10.0, 9.5, False, None),  # exactly one interval: now
        (10.0, 9.8, False, 0.3),  # inside the window: when it opens
        (10.0, 9.0, True, 0.0),  # one waits already (its timer runs): replaced, not sent now
        (10.0, 10.0, False, 0.5),  # the first report of a request waits one interval
    ],
)
def test_progress_leaves_at_most_once_per_interval(
    now: float, last: float, waiting: bool, expected: float | None
) -> None:
    delay = progress_delay(now, last, 0.5, waiting)
    if expected is None:
        assert delay is None
    else:
        assert delay == pytest.approx(expected)
