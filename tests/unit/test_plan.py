"""The one decision about an inbound message (vox_mqtt/agent/plan.py): every branch, no broker."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.kits.plankit import rejected
from vox_mqtt.agent.plan import (
    Admission,
    Answer,
    Answered,
    AnswerFacts,
    CommandFacts,
    Delegate,
    Duplicate,
    Event,
    Expired,
    Facts,
    Late,
    Local,
    RelayAnswer,
    Replay,
    Retained,
    Serve,
    SettleAck,
    Stopping,
    Unrecordable,
    Unroutable,
    Waiter,
    acts,
    admit,
    decide,
    decide_command,
    shown,
)
from vox_mqtt.observe.status import ACTIVE, INACTIVE, AgentLiveness
from vox_mqtt.protocol.domain import MSG_JOB_DETECTED
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    ErrorCode,
    VOXMessage,
    new_message,
)
from vox_mqtt.protocol.topics import InboxTopic

ME, MASTER, CHILD, OTHER = (UUID(int=n) for n in (1, 2, 3, 4))
ADMISSION = Admission(me=ME, master_id=MASTER, peers=frozenset({MASTER, CHILD}))


def command_from(source: UUID = MASTER, **details: object) -> VOXMessage:
    return new_message(
        MSG_COMMAND_REQUEST,
        source=source,
        target=ME,
        details={"command": "analyze", "params": {}, **details},
    )


def reply_from(kind: str, reply_to: UUID, source: UUID = CHILD) -> VOXMessage:
    details = (
        {"command": "analyze", "result": 1}
        if kind == MSG_COMMAND_RESULT
        else {"code": "HANDLER_ERROR", "error": "x"}
    )
    return new_message(kind, source=source, target=ME, details=details, reply_to=reply_to)


def inbox_of(message: VOXMessage) -> InboxTopic:
    return InboxTopic(target=ME, source=message.source)


async def analyze(message: VOXMessage) -> None:
    """The role's handler the command facts name."""


def facts_for_command(**changes: object) -> Facts:
    values: dict[str, object] = {
        "command": "analyze",
        "deadline_passed": False,
        "stopping": False,
        "slot_free": True,
        "local": Local.PLAIN,
        "handler": analyze,
    }
    values.update(changes)
    return Facts(command=CommandFacts(**values))  # type: ignore[arg-type]


def child(agent_id: UUID, *, status: str = ACTIVE, commands: tuple[str, ...] = ("analyze",)):  # type: ignore[no-untyped-def]
    return AgentLiveness(id=agent_id, status=status, commands=commands)


# --- admit ------------------------------------------------------------------------------------


def test_a_message_from_a_peer_on_its_own_topic_is_admitted() -> None:
    message = command_from()
    assert admit(message, inbox_of(message), ADMISSION) is None


def test_a_message_from_a_stranger_is_rejected_with_the_reason() -> None:
    plan = rejected(command_from(source=OTHER), ADMISSION)
    assert plan.code is ErrorCode.UNAUTHORIZED_SOURCE
    assert "neither this agent's master nor a child" in plan.reason


def test_a_command_from_a_child_is_rejected() -> None:
    plan = rejected(command_from(source=CHILD), ADMISSION)
    assert "commands come only from the master" in plan.reason


def test_a_message_whose_source_is_not_its_topic_is_rejected() -> None:
    plan = rejected(command_from(), ADMISSION, InboxTopic(target=ME, source=CHILD))
    assert "does not match the sender" in plan.reason


def test_a_retained_copy_is_never_acted_on() -> None:
    message = command_from()
    admission = Admission(me=ME, master_id=MASTER, peers=ADMISSION.peers, retained=True)
    plan = admit(message, inbox_of(message), admission)
    assert plan is not None
    assert isinstance(plan, Retained)
    assert not acts(plan)


def test_a_rejection_comes_before_the_retained_check() -> None:
    admission = Admission(me=ME, master_id=MASTER, peers=ADMISSION.peers, retained=True)
    rejected(command_from(source=OTHER), admission)


def test_nothing_is_admitted_when_the_ledger_cannot_record() -> None:
    message = command_from()
    admission = Admission(me=ME, master_id=MASTER, peers=ADMISSION.peers, write_failure="disk full")
    plan = admit(message, inbox_of(message), admission)
    assert plan == Unrecordable(reason="disk full")
    assert plan.acknowledge is False


# --- decide: acks and duplicates ----------------------------------------------------------------


def ack_of(message_id: UUID) -> VOXMessage:
    return new_message(
        MSG_ACKNOWLEDGED,
        source=CHILD,
        target=ME,
        details={"in_response_to": str(message_id)},
        reply_to=message_id,
    )


def test_an_ack_settles_and_is_never_acknowledged() -> None:
    plan = decide(ack_of(uuid4()), Facts())
    assert isinstance(plan, SettleAck)
    assert plan.acknowledge is False


def test_a_second_copy_of_an_ack_is_a_duplicate_and_still_not_acknowledged() -> None:
    plan = decide(ack_of(uuid4()), Facts(duplicate=True))
    assert isinstance(plan, Duplicate)
    assert plan.acknowledge is False


def test_a_duplicate_command_is_acknowledged_again_never_run() -> None:
    plan = decide(command_from(), Facts(duplicate=True, command=facts_for_command().command))
    assert isinstance(plan, Duplicate)
    assert plan.acknowledge is True
    assert not acts(plan)


def test_a_resent_command_whose_answer_is_held_replays_it_and_runs_nothing() -> None:
    facts = Facts(duplicate=True, answered=Answered.HELD, held=b'{"type": "command_result"}')
    plan = decide(command_from(), facts)
    assert plan == Replay(answer=b'{"type": "command_result"}')
    assert plan.acknowledge is False  # the replayed answer stands for the ack
    assert not acts(plan)


def test_a_resent_command_not_answered_yet_is_acknowledged_again_and_runs_nothing() -> None:
    plan = decide(command_from(), Facts(duplicate=True, answered=Answered.NOT_YET))
    assert isinstance(plan, Duplicate)
    assert plan.acknowledge is True
    assert not acts(plan)


def test_a_stray_copy_of_a_command_answered_long_ago_is_only_acknowledged() -> None:
    plan = decide(command_from(), Facts(duplicate=True, answered=Answered.GONE))
    assert isinstance(plan, Duplicate)
    assert plan.acknowledge is True


@pytest.mark.parametrize("answered", list(Answered))
def test_only_a_command_replays(answered: Answered) -> None:
    job = reply_from(MSG_COMMAND_RESULT, uuid4())
    plan = decide(job, Facts(duplicate=True, answered=answered))
    assert isinstance(plan, Duplicate)


@pytest.mark.parametrize("kind", [MSG_COMMAND_RESULT, MSG_COMMAND_ERROR])
def test_a_second_copy_of_an_answer_to_a_command_is_not_acknowledged(kind: str) -> None:
    facts = Facts(duplicate=True, answer=AnswerFacts(waiter=Waiter.NOBODY, to_command=True))
    plan = decide(reply_from(kind, uuid4()), facts)
    assert isinstance(plan, Duplicate)
    assert plan.acknowledge is False


# --- decide: commands ------------------------------------------------------------------------


def test_a_command_served_here_starts_at_once_when_a_slot_is_free() -> None:
    plan = decide(command_from(), facts_for_command())
    assert plan == Serve(handler=analyze, start_now=True)


def test_a_command_served_here_waits_for_a_slot_when_none_is_free() -> None:
    plan = decide(command_from(), facts_for_command(slot_free=False))
    assert plan == Serve(handler=analyze, start_now=False)


def test_only_an_idempotent_command_runs_before_its_record_commits() -> None:
    plan = decide(command_from(), facts_for_command(local=Local.IDEMPOTENT))
    assert plan == Serve(handler=analyze, start_now=True, run_early=True)
    busy = decide(command_from(), facts_for_command(local=Local.IDEMPOTENT, slot_free=False))
    assert busy == Serve(handler=analyze, start_now=False, run_early=False)


def test_a_command_while_stopping_is_answered_shutting_down() -> None:
    plan = decide(command_from(), facts_for_command(stopping=True))
    assert isinstance(plan, Stopping)


def test_a_command_past_its_deadline_is_never_started() -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    plan = decide(command_from(deadline=past), facts_for_command(deadline_passed=True))
    assert isinstance(plan, Expired)
    assert "not started" in plan.reason


def test_stopping_wins_over_an_expired_deadline() -> None:
    plan = decide(command_from(), facts_for_command(stopping=True, deadline_passed=True))
    assert isinstance(plan, Stopping)


def test_a_command_no_role_serves_goes_to_the_healthy_child_that_advertises_it() -> None:
    facts = facts_for_command(
        local=Local.NONE, children=(child(OTHER, status=INACTIVE), child(CHILD))
    )
    assert decide(command_from(), facts) == Delegate(child=CHILD)


def test_a_command_nobody_advertises_is_unroutable() -> None:
    facts = facts_for_command(local=Local.NONE, children=(child(CHILD, commands=("other",)),))
    plan = decide(command_from(), facts)
    assert plan == Unroutable(code=ErrorCode.NO_ROUTE)


def test_a_command_only_unhealthy_children_advertise_is_target_inactive() -> None:
    facts = facts_for_command(local=Local.NONE, children=(child(CHILD, status=INACTIVE), None))
    plan = decide(command_from(), facts)
    assert plan == Unroutable(code=ErrorCode.TARGET_INACTIVE)


def test_a_command_with_an_invalid_payload_is_left_to_the_runner_to_answer() -> None:
    assert isinstance(decide(command_from(), facts_for_command(command=None)), Serve)


ids = st.integers(min_value=10, max_value=40).map(lambda n: UUID(int=n))
children_st = st.lists(
    st.builds(
        AgentLiveness,
        id=ids,
        status=st.sampled_from([ACTIVE, INACTIVE, "STALE", "DEGRADED"]),
        commands=st.sets(st.sampled_from(["analyze", "other"])).map(tuple),
        # What its last ACTIVE status listed, and what it said is down below it.
        advertised=st.none() | st.sets(st.sampled_from(["analyze", "other"])).map(tuple),
        commands_down=st.sets(st.sampled_from(["analyze", "other"])).map(tuple),
    ),
    max_size=6,
    unique_by=lambda c: c.id,
)


@given(children=children_st, load=st.dictionaries(ids, st.integers(0, 5)))
def test_routing_rules_hold_for_any_children(
    children: list[AgentLiveness], load: dict[UUID, int]
) -> None:
    facts = facts_for_command(local=Local.NONE, children=tuple(children), load=load)
    plan = decide(command_from(), facts, tiebreak=lambda: 0.0)
    advertising = [c for c in children if "analyze" in c.commands]
    healthy = [c for c in advertising if c.healthy]
    if healthy:
        # Never an unhealthy child, never one that does not advertise it; the least busy.
        assert isinstance(plan, Delegate)
        chosen = next(c for c in children if c.id == plan.child)
        assert chosen in healthy
        assert load.get(chosen.id, 0) == min(load.get(c.id, 0) for c in healthy)
    elif advertising or any(
        "analyze" in c.commands_down or (not c.healthy and "analyze" in (c.advertised or ()))
        for c in children
    ):
        # Served below, by agents that are down: offline, not unknown (REQ-001-US-002-008).
        assert plan == Unroutable(code=ErrorCode.TARGET_INACTIVE)
    else:
        assert plan == Unroutable(code=ErrorCode.NO_ROUTE)


# --- decide: answers and events ----------------------------------------------------------------


@pytest.mark.parametrize("kind", [MSG_COMMAND_RESULT, MSG_COMMAND_ERROR])
def test_an_answer_to_a_request_that_ended_here_is_late(kind: str) -> None:
    request = uuid4()
    facts = Facts(answer=AnswerFacts(waiter=Waiter.ENDED, ended_as="expired"))
    plan = decide(reply_from(kind, request), facts)
    assert isinstance(plan, Late)
    assert plan.ended == "expired"
    assert str(request) in plan.reason


def test_a_childs_answer_to_a_delegated_command_is_relayed() -> None:
    facts = Facts(answer=AnswerFacts(waiter=Waiter.RELAY))
    assert isinstance(decide(reply_from(MSG_COMMAND_RESULT, uuid4()), facts), RelayAnswer)


def test_a_childs_unrecorded_refusal_goes_to_its_waiter_to_try_another_child() -> None:
    facts = Facts(answer=AnswerFacts(waiter=Waiter.RELAY, refused_unrecorded=True))
    assert isinstance(decide(reply_from(MSG_COMMAND_ERROR, uuid4()), facts), Answer)


def test_an_answer_a_caller_awaits_settles_it() -> None:
    facts = Facts(answer=AnswerFacts(waiter=Waiter.CALLER))
    assert isinstance(decide(reply_from(MSG_COMMAND_RESULT, uuid4()), facts), Answer)


def test_an_answer_nobody_awaits_goes_to_the_roles_as_an_event() -> None:
    facts = Facts(answer=AnswerFacts(waiter=Waiter.NOBODY))
    assert isinstance(decide(reply_from(MSG_COMMAND_RESULT, uuid4()), facts), Event)


@pytest.mark.parametrize("kind", [MSG_COMMAND_RESULT, MSG_COMMAND_ERROR])
@pytest.mark.parametrize("waiter", list(Waiter))
def test_an_answer_to_a_command_is_never_acknowledged(kind: str, waiter: Waiter) -> None:
    facts = Facts(answer=AnswerFacts(waiter=waiter, to_command=True, ended_as="expired"))
    plan = decide(reply_from(kind, uuid4()), facts)
    assert plan.acknowledge is False
    assert acts(plan)


@pytest.mark.parametrize("waiter", list(Waiter))
def test_an_error_answering_anything_but_a_command_is_acknowledged(waiter: Waiter) -> None:
    # A refused decision's command_error, for one: its sender re-sends it until acknowledged.
    facts = Facts(answer=AnswerFacts(waiter=waiter, to_command=False, ended_as="expired"))
    assert decide(reply_from(MSG_COMMAND_ERROR, uuid4()), facts).acknowledge is True


def test_a_notification_is_an_event() -> None:
    details = {
        "start_time": "2026-01-11T08:15:00-03:00",
        "end_time": "2026-01-11T16:00:00-03:00",
        "estimated_effort_minutes": 60,
        "price": {"currency": "USD", "value": 30},
    }
    job = new_message(MSG_JOB_DETECTED, source=CHILD, target=ME, details=details)
    plan = decide(job, Facts())
    assert isinstance(plan, Event)
    assert acts(plan)
    assert plan.acknowledge


# --- decide again: what an executor learned comes back as a fact --------------------------------


def test_a_child_that_refused_the_work_unrecorded_is_never_chosen_again() -> None:
    facts = facts_for_command(local=Local.NONE, children=(child(CHILD), child(OTHER)))
    command = facts.command
    assert command is not None
    again = decide_command(replace(command, refused_by=frozenset({CHILD})))
    assert again == Delegate(child=OTHER)


def test_when_every_child_refused_it_unrecorded_the_command_is_unroutable() -> None:
    facts = facts_for_command(local=Local.NONE, children=(child(CHILD), child(OTHER)))
    command = facts.command
    assert command is not None
    again = decide_command(replace(command, refused_by=frozenset({CHILD, OTHER})))
    assert isinstance(again, Unroutable)


def test_a_command_that_waited_for_a_slot_while_the_agent_began_stopping_is_refused() -> None:
    command = facts_for_command(slot_free=False).command
    assert command is not None
    assert isinstance(decide_command(replace(command, stopping=True)), Stopping)


def test_listeners_never_see_acks_copies_refusals_or_late_answers() -> None:
    late = Late(reason="x", ended="expired")
    for plan in (SettleAck(), Duplicate(), Replay(answer=b"{}"), Unrecordable(reason="x"), late):
        assert not shown(plan)
    for plan in (Event(), Answer(), RelayAnswer()):
        assert shown(plan)


def test_a_canceled_answer_is_not_replayed_while_the_handler_it_cut_still_runs() -> None:
    facts = Facts(duplicate=True, answered=Answered.HELD, held=b"{}", withheld=True)
    assert decide(command_from(), facts) == Duplicate(acknowledge=False)
