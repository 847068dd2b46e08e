"""F24: an answer, an ack or a report is taken only from the agent its request went to.

The pure check (`answered_request`, `answerer_problem`), the tracker's own guard, and the
pipeline's guard over a real SQLite ledger: refused, counted, recorded within a budget.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID, uuid4

import pytest

from vox_mqtt.agent.answerguard import WRONG_ROWS_BURST, AnswerGuard
from vox_mqtt.agent.rules import WRONG_ANSWERER, answered_request, answerer_problem
from vox_mqtt.agent.tracking import RequestTracker, SentState
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.acks import acknowledge
from vox_mqtt.protocol.lifecycle import MSG_COMMAND_PROGRESS
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    VOXMessage,
    new_message,
)
from vox_mqtt.protocol.settings import AgentConfig, BrokerSettings

ME, CHILD, SIBLING = uuid4(), uuid4(), uuid4()


def request(to: UUID = CHILD) -> VOXMessage:
    return new_message(MSG_COMMAND_REQUEST, source=ME, target=to, details={"command": "x"})


def answer(req: VOXMessage, by: UUID, kind: str = MSG_COMMAND_RESULT) -> VOXMessage:
    details = {"result": 1} if kind == MSG_COMMAND_RESULT else {"code": "X", "error": "e"}
    if kind == MSG_COMMAND_PROGRESS:
        details = {"state": "working", "seq": 1}
    return new_message(kind, source=by, target=ME, details=details, reply_to=req.message_id)


def test_answered_request_is_the_reply_to_or_the_acks_in_response_to() -> None:
    req = request()
    assert answered_request(answer(req, CHILD)) == req.message_id
    ack = acknowledge(req)
    assert answered_request(ack) == req.message_id
    # A command's reply_to is where it was delegated from: it answers nothing.
    down = new_message(
        MSG_COMMAND_REQUEST,
        source=ME,
        target=CHILD,
        details={"command": "x"},
        reply_to=req.message_id,
    )
    assert answered_request(down) is None
    assert answered_request(new_message("heads_up", source=CHILD, target=ME, details={})) is None


@pytest.mark.parametrize("kind", [MSG_COMMAND_RESULT, MSG_COMMAND_ERROR, MSG_COMMAND_PROGRESS])
def test_only_the_agent_a_request_went_to_may_answer_it(kind: str) -> None:
    req = request()
    assert answerer_problem(answer(req, CHILD, kind), CHILD) is None
    problem = answerer_problem(answer(req, SIBLING, kind), CHILD)
    assert problem is not None
    assert f"from {SIBLING}, which it was not sent to (it went to {CHILD})" in problem
    assert problem.startswith(kind)
    # Not a request this agent sent: nothing it could settle, nothing to refuse.
    assert answerer_problem(answer(req, SIBLING, kind), None) is None


def test_an_ack_from_the_sibling_is_refused_too() -> None:
    req = request()
    forged = acknowledge(req)
    forged_by_sibling = forged.model_copy(update={"source": SIBLING})
    assert answerer_problem(forged, CHILD) is None  # acknowledge() answers as the target
    assert answerer_problem(forged_by_sibling, CHILD) is not None


def test_the_tracker_moves_on_nothing_from_another_agent() -> None:
    tracker = RequestTracker()
    req = request()
    tracked = tracker.track(req, expects_reply=True)
    tracker.acknowledged(req.message_id, by=SIBLING)
    assert not tracked.acknowledged.is_set()
    tracker.completed(req.message_id, answer(req, SIBLING))
    tracker.failed(req.message_id, "X", "e", answer(req, SIBLING, MSG_COMMAND_ERROR))
    assert tracked.state is SentState.QUEUED
    assert not tracked.done.is_set()
    genuine = answer(req, CHILD)
    tracker.completed(req.message_id, genuine)
    assert tracked.state is SentState.COMPLETED
    assert tracked.reply == genuine


def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(
        id=ME,
        name="coord",
        master_id=uuid4(),
        children={CHILD: "spec_b", SIBLING: "spec_a"},
        state_dir=tmp_path,
        broker=BrokerSettings(host="127.0.0.1", port=1883, client_id="coord"),
    )


async def test_the_guard_refuses_counts_and_records_within_a_budget(tmp_path: Path) -> None:
    settings = config(tmp_path)
    tracker, metrics = RequestTracker(), AgentMetrics()
    async with VOXAgentMemory(tmp_path / "logs.db") as ledger:
        guard = AnswerGuard(
            settings=lambda: settings, ledger=ledger, tracker=tracker, metrics=metrics
        )
        req = request()
        tracker.track(req, expects_reply=True)
        genuine = answer(req, CHILD)
        assert not await guard.refused(genuine, "t", b"{}")
        # A flood of forged answers: each refused and counted, only a burst recorded.
        for _ in range(WRONG_ROWS_BURST + 30):
            assert await guard.refused(answer(req, SIBLING), "t", b"{}")
        assert metrics.rejected.values[WRONG_ANSWERER] == WRONG_ROWS_BURST + 30
        rows = [r for r in await ledger.get_recent(1000) if r["action"] == "rejected"]
        assert len(rows) == WRONG_ROWS_BURST
        assert all(str(r["reason"]).startswith(f"{WRONG_ANSWERER}: ") for r in rows)
        assert tracker.get(req.message_id).state is SentState.QUEUED  # type: ignore[union-attr]


async def test_an_answer_to_an_ended_untracked_request_is_checked_from_the_ledger(
    tmp_path: Path,
) -> None:
    settings = config(tmp_path)
    async with VOXAgentMemory(tmp_path / "logs.db") as ledger:
        req = request()
        await ledger.record_message(req, "sent")
        guard = AnswerGuard(
            settings=lambda: settings,
            ledger=ledger,
            tracker=RequestTracker(),
            metrics=AgentMetrics(),
        )
        assert await guard.refused(answer(req, SIBLING), "t", b"{}")
        assert not await guard.refused(answer(req, CHILD), "t", b"{}")
        # Never sent here: nothing to settle, so nothing refused (the plan calls it an event).
        assert not await guard.refused(answer(request(), SIBLING), "t", b"{}")
