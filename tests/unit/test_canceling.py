"""What a cancel has done: one level's state, and the operator's verdict (protocol/canceling.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kits.cancelkit import T0, T1, nested
from vox_mqtt.protocol.canceling import (
    AFTER_CANCEL_WHY,
    CANCELING_ANSWER,
    CANCELING_BELOW,
    CANCELING_HANDLER,
    answered_after_cancel,
    cancel_verdict,
    level_state,
)


@pytest.mark.parametrize("own", ["received", "working", "delegated", "completed", "unknown"])
def test_a_level_not_canceled_here_says_its_own_state(own: str) -> None:
    assert level_state(own, below="working", handler_running=True) == (own, None)


def test_a_canceled_level_whose_handler_still_runs_is_canceling() -> None:
    assert level_state("canceled", below=None, handler_running=True) == (
        "canceling",
        CANCELING_HANDLER,
    )


@pytest.mark.parametrize(
    "below", ["received", "working", "delegated", "canceling", "unknown", "unreachable"]
)
def test_a_canceled_level_whose_child_has_not_confirmed_is_canceling(below: str) -> None:
    # `unknown`: the request may still be on its way; `unreachable`: a frozen child may run it.
    assert level_state("canceled", below=below, handler_running=False) == (
        "canceling",
        CANCELING_BELOW,
    )


@pytest.mark.parametrize("below", [None, "canceled", "completed", "failed", "expired", "rejected"])
def test_a_canceled_level_is_canceled_once_nothing_can_run(below: str | None) -> None:
    assert level_state("canceled", below=below, handler_running=False) == ("canceled", None)


def test_every_level_canceled_is_canceled() -> None:
    report = nested(
        {"state": "canceled", "since": T0}, {"state": "canceled"}, {"state": "canceled"}
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level, verdict.since) == ("canceled", None, T0)
    assert verdict.line == f"canceled since {T0}"


def test_a_frozen_level_names_itself_as_not_confirmed() -> None:
    report = nested(
        {"state": "canceling", "since": T0, "why": CANCELING_BELOW},
        {"state": "canceling", "why": CANCELING_BELOW},
        {"state": "unreachable", "why": "no status_report within 3.0s"},
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("canceling", 3)
    assert verdict.line == (
        f"canceling since {T0}: level 3 has not confirmed (unreachable: no status_report within"
        " 3.0s)"
    )
    assert "canceled" not in verdict.line


def test_a_handler_outliving_its_cancel_keeps_it_canceling() -> None:
    report = nested({"state": "canceling", "since": T0, "why": CANCELING_HANDLER})
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("canceling", 1)
    assert "root has not confirmed" in verdict.line


def test_a_level_that_ran_before_its_cancel_came_is_told_as_such() -> None:
    report = nested(
        {"state": "canceled", "since": T0},
        {"state": "canceled", "since": T0},
        {"state": "completed", "since": T1},
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("completed", 3)
    assert verdict.line == (
        f"canceled at root, level 2, but level 3 had completed since {T1}:"
        " the cancel reached it after it ran"
    )


def test_a_request_finished_at_the_root_was_not_canceled() -> None:
    verdict = cancel_verdict({"state": "completed", "since": T1}, "root")
    assert (verdict.state, verdict.level) == ("completed", 1)
    assert verdict.line == f"not canceled, already completed since {T1}"


def test_a_request_the_root_never_received_is_unknown() -> None:
    verdict = cancel_verdict({"state": "unknown"}, "root")
    assert (verdict.state, verdict.level) == ("unknown", None)
    assert verdict.as_json()["line"] == "unknown to the root (root)"


def test_a_root_still_delegating_has_not_confirmed() -> None:
    verdict = cancel_verdict(nested({"state": "delegated"}, {"state": "working"}), "root")
    assert (verdict.state, verdict.level) == ("canceling", 1)


def test_a_handler_started_before_its_cancel_came_is_told() -> None:
    started = {
        "state": "canceled",
        "since": T1,
        "history": [
            {"state": "received", "at": T1},
            {"state": "working", "at": T1},
            {"state": "canceled", "at": T1},
        ],
    }
    report = nested({"state": "canceled", "since": T0}, {"state": "canceled"}, started)
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("canceled", None)
    assert verdict.line == (
        f"canceled since {T0}; its handler had started at level 3 before the cancel came"
    )


# --- a level that passed its cancel down (its `canceling` row, docs/ledger.md) -------------


@pytest.mark.parametrize(
    "below", ["received", "working", "delegated", "canceling", "unknown", "unreachable"]
)
def test_a_level_that_passed_its_cancel_down_waits_for_its_child(below: str) -> None:
    assert level_state("canceling", below=below, handler_running=False) == (
        "canceling",
        CANCELING_BELOW,
    )


@pytest.mark.parametrize("below", ["canceled", "completed", "failed"])
def test_a_level_that_passed_its_cancel_down_is_canceling_until_its_answer_went_up(
    below: str,
) -> None:
    # Its child's final part: nothing runs below; `canceled` once its own row says so.
    assert level_state("canceling", below=below, handler_running=False) == (
        "canceling",
        CANCELING_ANSWER,
    )


def test_a_level_whose_answer_is_on_its_way_up_has_not_confirmed_yet() -> None:
    report = nested(
        {"state": "canceling", "since": T0, "why": CANCELING_BELOW},
        {"state": "canceling", "why": CANCELING_ANSWER},
        {"state": "canceled"},
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("canceling", 2)


def after_cancel(state: str, since: str = T1) -> dict[str, Any]:
    """A level that passed its cancel down, then relayed the end that came up anyway."""
    history = [
        {"state": "received", "at": T0},
        {"state": "delegated", "at": T0},
        {"state": "canceling", "at": T0},
        {"state": state, "at": since},
    ]
    return {"state": state, "since": since, "history": history, "why": AFTER_CANCEL_WHY}


def test_an_end_after_a_cancel_passed_down_is_told_apart() -> None:
    assert answered_after_cancel(after_cancel("completed"))
    assert answered_after_cancel(after_cancel("failed"))
    assert not answered_after_cancel(after_cancel("canceled"))  # that is the confirmation
    assert not answered_after_cancel({"state": "completed", "since": T1})
    assert not answered_after_cancel({"state": "canceling", "history": [{"state": "canceling"}]})


def test_a_result_relayed_after_the_cancel_names_the_level_that_ran_it() -> None:
    report = nested(
        after_cancel("completed"), after_cancel("completed"), {"state": "completed", "since": T1}
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("completed", 3)
    assert verdict.line == (
        f"canceled at root, level 2, but level 3 had completed since {T1}:"
        " the cancel reached it after it ran"
    )


def test_a_timeout_relayed_while_a_level_never_confirmed_is_still_canceling() -> None:
    # The deadline ended the wait at the upper levels: the frozen level never confirmed.
    report = nested(
        after_cancel("failed"),
        after_cancel("failed"),
        {"state": "unreachable", "why": "no status_report within 3.0s"},
    )
    verdict = cancel_verdict(report, "root")
    assert (verdict.state, verdict.level) == ("canceling", 3)
    assert "canceled" not in verdict.line


def test_a_root_ended_after_its_cancel_with_nothing_below_says_not_canceled() -> None:
    verdict = cancel_verdict(after_cancel("completed"), "root")
    assert (verdict.state, verdict.level) == ("completed", 1)
    assert (
        verdict.line
        == f"not canceled: root had completed since {T1}: the cancel reached it after it ran"
    )
