"""A master's rounds of status queries after a cancel (agent/cancelconfirm.py, `confirmed`).

`ask` stands for the child: each round takes the next answer given here (a nested report,
or CommandFailed: none in time), as a loaded machine gives them, and takes one second of a
clock of the test's own: the rounds asked are the answers given, however loaded the machine.
"""

from __future__ import annotations

from typing import Any

from tests.kits.cancelkit import T0, nested
from vox_mqtt.agent.cancelconfirm import confirmed
from vox_mqtt.protocol.canceling import CANCELING_BELOW, CANCELING_HANDLER
from vox_mqtt.protocol.errors import CommandFailed

# Every level canceled, the third's handler still running (docs/messages.md).
HANDLER_RUNS = nested(
    {"state": "canceling", "since": T0, "why": CANCELING_BELOW},
    {"state": "canceling", "why": CANCELING_BELOW},
    {"state": "canceling", "why": CANCELING_HANDLER},
)
# The same, but the second level's query of the third came back too late.
THIRD_LATE = nested(
    {"state": "canceling", "since": T0, "why": CANCELING_BELOW},
    {"state": "canceling", "why": CANCELING_BELOW},
    {"state": "unreachable", "why": "no status_report within 0.4s"},
)
# The same, but the second level's answer came too late for the root.
SECOND_LATE = nested(
    {"state": "canceling", "since": T0, "why": CANCELING_BELOW},
    {"state": "unreachable", "why": "no status_report within 0.6s"},
)
ALL_CANCELED = nested(
    {"state": "canceled", "since": T0}, {"state": "canceled"}, {"state": "canceled"}
)
LATE = "late"  # the round's query got no answer in time: the root is unreachable


async def told(*answers: Any) -> dict[str, Any]:
    """What `confirmed` tells from these answers, one a round, a second each, then its end."""
    given = list(answers)
    now = [0.0]

    async def ask(within: float) -> dict[str, Any]:
        now[0] += 1.0
        answer = given.pop(0)
        if answer == LATE:
            raise CommandFailed("TIMEOUT", f"no status_report within {within:.1f}s")
        return dict(answer)

    # Ends as the last answer is given: each round's pause is cut short by the end.
    verdict = await confirmed(ask, "root", len(answers) - 0.99, most=5.0, clock=lambda: now[0])
    assert given == [] or verdict["state"] != "canceling"  # every round asked, or it ended
    return verdict


async def test_a_round_without_an_answer_does_not_undo_what_an_earlier_one_showed() -> None:
    # The last round, the shortest, came too late at each level in turn (the flaky test).
    for late in (LATE, SECOND_LATE, THIRD_LATE):
        verdict = await told(HANDLER_RUNS, late)
        assert (verdict["state"], verdict["level"]) == ("canceling", 3), late
        assert f"level 3 has not confirmed (canceling: {CANCELING_HANDLER})" in verdict["line"]
        assert verdict["levels"] == HANDLER_RUNS


async def test_a_round_that_went_further_down_is_told() -> None:
    verdict = await told(LATE, SECOND_LATE, THIRD_LATE)
    assert (verdict["state"], verdict["level"]) == ("canceling", 3)
    assert "level 3 has not confirmed (unreachable" in verdict["line"]
    verdict = await told(THIRD_LATE, HANDLER_RUNS, THIRD_LATE)
    assert CANCELING_HANDLER in verdict["line"]  # as deep, and level 3 answered


async def test_no_answer_at_all_names_the_child_as_not_confirmed() -> None:
    verdict = await told(LATE)
    assert (verdict["state"], verdict["level"]) == ("canceling", 1)
    assert "root has not confirmed (unreachable: no status_report within" in verdict["line"]


async def test_every_level_confirmed_is_told_at_once() -> None:
    verdict = await told(LATE, ALL_CANCELED, HANDLER_RUNS)
    assert (verdict["state"], verdict["level"]) == ("canceled", None)
