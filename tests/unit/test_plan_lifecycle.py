"""The lifecycle branches of the one decision (agent/plan.py): cancel, status, progress."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from tests.kits.plankit import rejected
from vox_mqtt.agent.plan import (
    Admission,
    CanceledBefore,
    CancelFacts,
    CancelFinished,
    CancelFinishing,
    CancelInFlight,
    CancelUnknown,
    CommandFacts,
    Duplicate,
    Event,
    Facts,
    Local,
    Progress,
    Status,
    acts,
    admit,
    decide,
)
from vox_mqtt.protocol.lifecycle import (
    MSG_CANCEL_REPORT,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
)
from vox_mqtt.protocol.messages import ErrorCode, VOXMessage, new_message
from vox_mqtt.protocol.topics import InboxTopic

ME, MASTER, CHILD, OTHER = (UUID(int=n) for n in (1, 2, 3, 4))
ADMISSION = Admission(me=ME, master_id=MASTER, peers=frozenset({MASTER, CHILD}))


def message(type: str, source: UUID, details: dict[str, object], **kw: object) -> VOXMessage:
    return new_message(type, source=source, target=ME, details=details, **kw)  # type: ignore[arg-type]


def cancel_from(source: UUID = MASTER) -> VOXMessage:
    return message(MSG_CANCEL_REQUEST, source, {"request_id": str(uuid4()), "reason": "stuck"})


def query_from(source: UUID = MASTER) -> VOXMessage:
    return message(MSG_STATUS_QUERY, source, {"request_id": str(uuid4())})


def progress_from(source: UUID = CHILD) -> VOXMessage:
    return message(MSG_COMMAND_PROGRESS, source, {"state": "working", "seq": 1}, reply_to=uuid4())


def inbox_of(sent: VOXMessage) -> InboxTopic:
    return InboxTopic(target=ME, source=sent.source)


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("received", CancelInFlight),
        ("working", CancelInFlight),
        ("delegated", CancelInFlight),
        ("answering", CancelFinishing),
        ("unknown", CancelUnknown),
    ],
)
def test_a_cancel_does_what_the_request_state_calls_for(target: str, kind: type) -> None:
    plan = decide(cancel_from(), Facts(cancel=CancelFacts(target=target)))
    assert type(plan) is kind
    assert acts(plan)
    assert plan.acknowledge


@pytest.mark.parametrize("final", ["completed", "failed", "expired", "canceled", "rejected"])
def test_a_cancel_of_a_finished_request_reports_its_end(final: str) -> None:
    plan = decide(cancel_from(), Facts(cancel=CancelFacts(target=final)))
    assert isinstance(plan, CancelFinished)
    assert plan.ended == final
    assert final in plan.reason


def test_a_cancel_of_a_request_never_received_beyond_its_senders_budget_is_not_remembered() -> None:
    facts = Facts(cancel=CancelFacts(target="unknown", within_budget=False))
    assert decide(cancel_from(), facts) == CancelUnknown(beyond_budget=True)
    assert decide(cancel_from(), Facts(cancel=CancelFacts(target="unknown"))) == CancelUnknown()


def test_a_second_copy_of_a_cancel_changes_nothing() -> None:
    facts = Facts(duplicate=True, cancel=CancelFacts(target="working"))
    assert isinstance(decide(cancel_from(), facts), Duplicate)


@pytest.mark.parametrize("build", [cancel_from, query_from])
def test_only_the_master_may_cancel_or_ask(build: object) -> None:
    assert callable(build)
    sent = build(CHILD)
    plan = rejected(sent, ADMISSION)
    assert plan.code is ErrorCode.UNAUTHORIZED_SOURCE
    assert f"{sent.type} from a child: only this agent's master may send it" == plan.reason
    # A stranger is refused before that: it is no peer at all.
    plan = rejected(build(OTHER), ADMISSION)
    assert "neither this agent's master nor a child" in plan.reason
    # From the master: admitted.
    assert admit(build(MASTER), InboxTopic(target=ME, source=MASTER), ADMISSION) is None


def test_progress_comes_only_from_a_child() -> None:
    plan = rejected(progress_from(MASTER), ADMISSION)
    assert "progress comes only from a child" in plan.reason
    assert admit(progress_from(), inbox_of(progress_from()), ADMISSION) is None


def test_a_status_query_is_answered_not_acknowledged() -> None:
    plan = decide(query_from(), Facts())
    assert (type(plan), plan.acknowledge, acts(plan)) == (Status, False, True)


def test_progress_is_recorded_never_acknowledged() -> None:
    plan = decide(progress_from(), Facts())
    assert (type(plan), plan.acknowledge, acts(plan)) == (Progress, False, True)


def test_a_cancel_report_is_an_answer_like_any_other() -> None:
    report = message(
        MSG_CANCEL_REPORT,
        CHILD,
        {"request_id": str(uuid4()), "state": "canceled"},
        reply_to=uuid4(),
    )
    assert isinstance(decide(report, Facts()), Event)


@pytest.mark.parametrize("stopping", [False, True])
@pytest.mark.parametrize("deadline_passed", [False, True])
def test_a_command_canceled_before_it_came_never_starts(
    stopping: bool, deadline_passed: bool
) -> None:
    sent = message("command_request", MASTER, {"command": "analyze"})
    facts = CommandFacts(
        command="analyze",
        deadline_passed=deadline_passed,
        stopping=stopping,
        slot_free=True,
        local=Local.PLAIN,
        canceled_before=True,
    )
    plan = decide(sent, Facts(command=facts))
    assert isinstance(plan, CanceledBefore)  # never Serve: nothing starts, early or late
    assert "not started" in plan.reason
