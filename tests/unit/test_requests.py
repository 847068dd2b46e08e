"""Requests: the one owner of what an agent serves; each command's life and its child's load."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

from vox_mqtt.agent.outgoing import Outgoing
from vox_mqtt.agent.plan import Delegate, Serve
from vox_mqtt.agent.requests import ANSWER_MOVES, Answering, Requests, answer_move, ended_by
from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.ledger.actions import AFTER_CANCEL
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_REQUEST,
    CommandError,
    CommandResult,
    ErrorCode,
    VOXMessage,
    new_message,
)
from vox_mqtt.protocol.requeststates import RequestState

MASTER, ME, CHILD, OTHER = uuid4(), uuid4(), uuid4(), uuid4()


def command(source: UUID = MASTER, target: UUID = ME) -> VOXMessage:
    return new_message(
        MSG_COMMAND_REQUEST, source=source, target=target, details={"command": "analyze"}
    )


def owner() -> Requests:
    return Requests(RequestTracker())


async def test_a_served_command_moves_through_its_states_and_leaves_once_final() -> None:
    requests = owner()
    served = requests.open(command(), Serve(handler=print))
    assert requests.get(served.message_id) is served
    assert requests.in_flight == 1
    requests.move(served, RequestState.WORKING)
    requests.move(served, RequestState.COMPLETED)
    assert served.final
    assert requests.get(served.message_id) is None
    assert requests.in_flight == 0
    assert [state for state, _ in served.history] == [
        RequestState.RECEIVED,
        RequestState.WORKING,
        RequestState.COMPLETED,
    ]


async def test_a_final_state_is_final() -> None:
    requests = owner()
    served = requests.open(command(), Serve(handler=print))
    requests.move(served, RequestState.EXPIRED)
    requests.move(served, RequestState.COMPLETED)
    assert served.state is RequestState.EXPIRED
    assert not requests.claim_answer(served)


async def test_delegation_counts_the_childs_load_until_its_part_is_over() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    downstream = requests.sent.track(command(ME, CHILD), expects_reply=True)
    requests.delegate(served, CHILD, downstream)
    assert served.state is RequestState.DELEGATED
    assert dict(requests.load) == {CHILD: 1}
    assert requests.relaying(downstream.message_id) is served
    requests.undelegate(served)
    assert dict(requests.load) == {}
    assert requests.relaying(downstream.message_id) is None


async def test_a_second_child_replaces_the_first_and_load_follows() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    first = requests.sent.track(command(ME, CHILD), expects_reply=True)
    requests.delegate(served, CHILD, first)
    second = requests.sent.track(command(ME, OTHER), expects_reply=True)
    requests.delegate(served, OTHER, second)
    assert dict(requests.load) == {OTHER: 1}
    assert requests.relaying(first.message_id) is None
    assert requests.relaying(second.message_id) is served


async def test_a_downstream_request_that_ended_is_no_longer_relayed() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    downstream = requests.sent.track(command(ME, CHILD), expects_reply=True)
    requests.delegate(served, CHILD, downstream)
    requests.sent.expired(downstream.message_id, "no answer")
    assert requests.relaying(downstream.message_id) is None


async def test_finishing_a_delegated_command_frees_its_child() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    requests.delegate(served, CHILD, requests.sent.track(command(ME, CHILD), expects_reply=True))
    requests.move(served, RequestState.FAILED)
    assert dict(requests.load) == {}


async def test_only_one_answer_is_claimed() -> None:
    requests = owner()
    served = requests.open(command(), Serve(handler=print))
    assert requests.claim_answer(served)
    assert not requests.claim_answer(served)
    assert requests.unanswered() == []


async def test_a_dropped_command_was_never_accepted() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    requests.drop(served)
    assert requests.get(served.message_id) is None
    assert requests.in_flight == 0
    assert await served.recorded is False  # a cancel waiting for its commit learns it failed


async def test_whether_a_record_committed_is_awaited_never_polled() -> None:
    requests = owner()
    served = requests.open(command(), Serve(handler=print))
    assert not served.recorded.done()  # staged, its commit under way
    requests.committed(served)
    assert await served.recorded is True
    requests.drop(served)  # a later drop changes nothing of what was told
    assert await served.recorded is True
    resumed = requests.open(command(), Serve(handler=print), recorded=True)
    assert await resumed.recorded is True


def test_idle_is_awaitable_once_nothing_is_served() -> None:
    async def scenario() -> bool:
        requests = owner()
        served = requests.open(command(), Serve(handler=print))
        waiting = asyncio.ensure_future(requests.wait_idle())
        await asyncio.sleep(0)
        busy = not waiting.done()
        requests.move(served, RequestState.COMPLETED)
        await asyncio.wait_for(waiting, 1)
        return busy

    assert asyncio.run(scenario())


def test_an_answer_ends_its_command_canceled_only_when_it_is_canceled() -> None:
    assert ended_by(CommandResult(command="analyze", result={})) is RequestState.COMPLETED
    canceled = CommandError(code=ErrorCode.CANCELED, error="canceled by its master")
    assert ended_by(canceled) is RequestState.CANCELED
    timeout = CommandError(code=ErrorCode.TIMEOUT, error="no answer within 3.0s")
    assert ended_by(timeout) is RequestState.FAILED


async def test_an_end_after_a_cancel_passed_down_is_recorded_as_such() -> None:
    requests = owner()
    served = requests.open(command(), Delegate(child=CHILD))
    assert served.outcome_of(RequestState.COMPLETED) is None
    assert served.outcome_of(RequestState.CANCELED) == ErrorCode.CANCELED
    requests.passing_cancel_down(served)  # its `canceling` row committed: the child confirms
    assert served.outcome_of(RequestState.COMPLETED) == AFTER_CANCEL
    assert served.outcome_of(RequestState.FAILED) == AFTER_CANCEL
    assert served.outcome_of(RequestState.CANCELED) == ErrorCode.CANCELED


async def test_an_answer_whose_commit_failed_leaves_no_end_behind() -> None:
    # A cancel's report reads answer_end for an answer on its way (agent/lifecycle.py): one
    # whose commit failed was never recorded, so it must not be reported as the end.
    requests = owner()
    request = command()
    served = requests.open(request, Serve(handler=print))
    answer = request.reply("command_error", {"code": "TIMEOUT", "error": "slow"})
    outgoing = Outgoing(message=answer, expects_reply=False, topic="t", payload=b"{}")
    requests.answer_prepared(served, outgoing, RequestState.FAILED, "TIMEOUT")
    assert (served.answer_end, served.answer_code) == (RequestState.FAILED, "TIMEOUT")
    requests.answer_unprepared(served)
    assert (served.answer, served.answer_end, served.answer_code) == (None, None, None)
    assert not served.final


def test_the_answer_moves_only_as_its_table_allows() -> None:
    open_, claimed, staged = Answering.OPEN, Answering.CLAIMED, Answering.STAGED
    assert answer_move(open_, "claim") is claimed
    assert answer_move(claimed, "release") is open_
    assert answer_move(open_, "stage") is staged  # a quick answer, with its record
    assert answer_move(claimed, "stage") is staged  # a child's answer relayed
    assert answer_move(staged, "unstage") is open_
    refused = [
        (state, move)
        for state in Answering
        for move in ("claim", "release", "stage", "unstage")
        if (state, move) not in ANSWER_MOVES
    ]
    assert all(answer_move(state, move) is None for state, move in refused)
    assert (claimed, "claim") in refused  # one part answers, never two
    assert (staged, "claim") in refused  # an answer riding a commit is not taken over
    assert (staged, "release") in refused  # a staged answer is unstaged, not released


async def test_an_answer_riding_a_commit_is_taken_by_nobody_else() -> None:
    requests = owner()
    request = command()
    served = requests.open(request, Serve(handler=print))
    answer = request.reply("command_result", {"result": 1})
    outgoing = Outgoing(message=answer, expects_reply=False, topic="t", payload=b"{}")
    requests.answer_prepared(served, outgoing, RequestState.COMPLETED, None)  # quick
    assert served.answer_state is Answering.STAGED
    assert served.answering
    assert not requests.claim_answer(served)  # a cancel or a stop meanwhile: refused
    assert requests.unanswered() == []
    requests.release_answer(served)  # not how a staged answer goes back: nothing changes
    assert served.answer_state is Answering.STAGED
    requests.answer_unprepared(served)  # its commit failed
    assert served.answer_state is Answering.OPEN
    assert requests.claim_answer(served)
    assert served.answer_state is Answering.CLAIMED


async def test_a_command_s_progress_window_hangs_on_its_record_and_opens_once() -> None:
    requests = owner()
    served = requests.open(command(), Serve(handler=print))
    assert served.progress is None  # a quick command never reports: no window
    window = requests.progress_window(served)
    assert requests.progress_window(served) is window
    assert served.progress is window
    assert (window.seq, window.pending, window.timer) == (0, None, None)
