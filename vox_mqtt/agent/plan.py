"""One plan per inbound inbox message: what it means, decided once by a pure function.

The pipeline gathers what the decision reads into `Facts` (the router and the fleet view are
consulted there, once), calls `decide`, then carries the plan out: the rows it implies
commit in one transaction and the part that executes it gets the committed plan
(docs/architecture.md, one command from bytes to handler and back).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID

from vox_mqtt.agent.rules import choose_child, verify
from vox_mqtt.observe.status import AgentLiveness
from vox_mqtt.protocol.lifecycle import (
    FINAL_STATES,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
)
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    ErrorCode,
    VOXMessage,
)
from vox_mqtt.protocol.topics import InboxTopic

__all__ = [
    "Admission",
    "AnswerFacts",
    "Answered",
    "CancelAction",
    "CommandFacts",
    "Facts",
    "Local",
    "Plan",
    "Step",
    "Waiter",
    "admit",
    "decide",
]

ANSWERS = frozenset({MSG_COMMAND_RESULT, MSG_COMMAND_ERROR})


class Step(StrEnum):
    """What an inbound message means to this agent."""

    REJECT = "reject"  # not accepted (docs/topics.md): recorded rejected, answered if a peer's
    RETAINED = "retained"  # a retained message in an inbox: recorded, never acted on
    UNRECORDABLE = "unrecordable"  # the ledger cannot write: refused, never acknowledged
    DUPLICATE = "duplicate"  # seen before: acknowledged again, never acted on again
    REPLAY = "replay"  # a re-sent command answered here: its recorded answer goes again
    SETTLE_ACK = "settle_ack"  # an acknowledgement of a message this agent sent
    SERVE = "serve"  # a command a role here serves
    DELEGATE = "delegate"  # a command for a child (`child`)
    UNROUTABLE = "unroutable"  # a command neither a role here nor a healthy child serves
    EXPIRED = "expired"  # a command past its deadline: answered TIMEOUT, never started
    STOPPING = "stopping"  # a command while the agent stops: answered SHUTTING_DOWN
    RELAY_ANSWER = "relay_answer"  # a child's answer to a command delegated from here
    ANSWER = "answer"  # an answer to a request a caller here awaits
    LATE = "late"  # an answer to a request that already ended here
    EVENT = "event"  # anything else: listeners and event handlers
    # A request's life (docs/messages.md, lifecycle):
    CANCEL = "cancel"  # the master's cancel_request: what it does is `cancel`
    CANCELED_BEFORE = "canceled_before"  # a command whose cancel came first: never started
    STATUS = "status"  # the master's status_query: answered from the ledger (and the child)
    PROGRESS = "progress"  # a child's command_progress: told to waiters, passed up by a relay


class CancelAction(StrEnum):
    """What a cancel_request does to the request it names, by where that request stands here."""

    NEVER_START = "never_start"  # waiting for a handler slot: it never starts
    STOP = "stop"  # its handler runs: its task is cancelled
    PASS_DOWN = "pass_down"  # delegated: the child is told to cancel the downstream request
    FINAL = "final"  # already answered: the report gives its final state (`ended`)
    FINISHING = "finishing"  # its answer is being sent: the report waits for its end
    REMEMBER = "remember"  # not (yet) received: remembered, so it never starts when it comes


class Local(StrEnum):
    """Whether a role here serves a command, and how."""

    NONE = "none"
    PLAIN = "plain"  # its start must be durable before its handler runs
    IDEMPOTENT = "idempotent"  # @command(idempotent=True): it may start while its record commits


class Answered(StrEnum):
    """What this agent holds of its answer to a command_request it received (a duplicate's)."""

    NOT_YET = "not_yet"  # no answer recorded: it waits, runs or is delegated
    HELD = "held"  # its answer is recorded and held for replay until the request's deadline
    GONE = "gone"  # answered, but the answer is no longer held: its deadline passed


class Waiter(StrEnum):
    """Who waits for the request an answer names (its reply_to), as this agent sees it."""

    NOBODY = "nobody"  # not a request of this agent's, or one nobody awaits (after a restart)
    CALLER = "caller"  # a request(), ask() or a role awaits it
    RELAY = "relay"  # this agent delegated it and answers upstream once it is answered
    ENDED = "ended"  # it already ended here (expired, failed): an answer now is late


@dataclass(frozen=True, kw_only=True)
class CommandFacts:
    """What deciding a command reads of the agent: gathered once, only for commands."""

    command: str | None  # None: its payload is not a valid command_request
    deadline_passed: bool
    stopping: bool
    slot_free: bool  # a handler slot can be taken at once
    local: Local
    children: Sequence[
        AgentLiveness | None
    ] = ()  # this agent's children as the fleet view has them
    load: Mapping[UUID, int] = field(default_factory=dict)  # requests in flight per child
    canceled_before: bool = False  # its master's cancel_request came before it


@dataclass(frozen=True, kw_only=True)
class AnswerFacts:
    """What deciding an answer reads: who waits for the request it names."""

    waiter: Waiter
    refused_unrecorded: bool = False  # a LEDGER_UNAVAILABLE error: the work goes elsewhere
    ended_as: str = ""  # with Waiter.ENDED: how the request ended here
    # The request it names is a command_request this agent sent: its answer is never
    # acknowledged, the request is re-sent until answered (docs/messages.md).
    to_command: bool = False


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What `admit` reads: who may write to this agent, and whether it can record now."""

    me: UUID
    master_id: UUID | None
    peers: frozenset[UUID]
    retained: bool = False
    write_failure: str | None = None  # why the ledger cannot take writes now


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What `decide` reads about an admitted message and the agent at that moment."""

    duplicate: bool = False  # the ledger already holds this message
    answered: Answered = Answered.NOT_YET  # for a duplicate command_request: its answer here
    command: CommandFacts | None = None  # for a command_request
    answer: AnswerFacts | None = None  # for a message with reply_to
    # For a cancel_request: where the request it names stands here (a ServedState value,
    # "answering", a final state read from the ledger, or "unknown").
    target: str | None = None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The decision about one inbound message; effects follow it, none are in it."""

    step: Step
    reason: str = ""  # REJECT: why; UNROUTABLE, EXPIRED, LATE: for the log and the answer
    code: ErrorCode | None = None  # REJECT, UNROUTABLE: the error code
    child: UUID | None = None  # DELEGATE: the child chosen
    start_now: bool = False  # SERVE: take a free slot and commit "started" with "received"
    run_early: bool = False  # SERVE: idempotent, its handler starts before the commit
    acknowledge: bool = True  # whether the message gets a message_acknowledged
    ended: str = ""  # LATE, CANCEL (FINAL): how the request it names ended here
    cancel: CancelAction | None = None  # CANCEL: what it does

    @property
    def acts(self) -> bool:
        """Tell whether the message is recorded as received and acted on."""
        return self.step not in _NOT_ACTED_ON


_NOT_ACTED_ON = frozenset(
    {Step.REJECT, Step.RETAINED, Step.UNRECORDABLE, Step.DUPLICATE, Step.REPLAY}
)


def admit(message: VOXMessage, topic: InboxTopic, facts: Admission) -> Plan | None:
    """Decide whether a message may be taken in at all; None: admitted (then `decide`).

    Checked before the ledger is read, in this order: who sent it and where, a retained
    copy, a ledger that cannot record.
    """
    problem = verify(message, topic, me=facts.me, master_id=facts.master_id, peers=facts.peers)
    if problem is not None:
        return Plan(step=Step.REJECT, reason=problem, code=ErrorCode.UNAUTHORIZED_SOURCE)
    if facts.retained:
        return Plan(step=Step.RETAINED, reason="retained message in an inbox: never executed")
    if facts.write_failure is not None:
        return Plan(step=Step.UNRECORDABLE, reason=facts.write_failure, acknowledge=False)
    return None


def decide(
    message: VOXMessage, facts: Facts, *, tiebreak: Callable[[], float] = random.random
) -> Plan:
    """Decide what an admitted inbox message means to this agent."""
    if message.type == MSG_ACKNOWLEDGED:
        # An ack is never acknowledged; a second copy of one changes nothing either.
        step = Step.DUPLICATE if facts.duplicate else Step.SETTLE_ACK
        return Plan(step=step, acknowledge=False)
    if facts.duplicate:
        return _decide_duplicate(message, facts)
    if message.type == MSG_COMMAND_REQUEST and facts.command is not None:
        return _decide_command(facts.command, tiebreak)
    if message.type == MSG_CANCEL_REQUEST and facts.target is not None:
        return _decide_cancel(facts.target)
    if message.type == MSG_STATUS_QUERY:
        # Its status_report stands for the acknowledgement, as a quick answer does.
        return Plan(step=Step.STATUS, acknowledge=False)
    if message.type == MSG_COMMAND_PROGRESS:
        # Fire and forget (docs/messages.md): recorded here, never acknowledged.
        return Plan(step=Step.PROGRESS, acknowledge=False)
    if message.reply_to is not None and facts.answer is not None:
        return _decide_answer(message, facts.answer)
    return Plan(step=Step.EVENT)


def _decide_duplicate(message: VOXMessage, facts: Facts) -> Plan:
    """A copy of a message already recorded here: nothing runs again (docs/messages.md)."""
    if message.type == MSG_COMMAND_REQUEST and facts.answered is Answered.HELD:
        # Its requester lacks the answer: the recorded one goes again, same id, and stands
        # for the acknowledgement; the command never runs twice.
        return Plan(step=Step.REPLAY, acknowledge=False)
    if _answers_command(message, facts.answer):
        # An answer is never acknowledged: a second copy of one is not either.
        return Plan(step=Step.DUPLICATE, acknowledge=False)
    # Still waiting, running or delegated (its ack again), or answered so long ago that its
    # requester gave up at the deadline (a stray copy): acknowledged again, as any duplicate.
    return Plan(step=Step.DUPLICATE)


def _answers_command(message: VOXMessage, facts: AnswerFacts | None) -> bool:
    """Tell whether a message is an answer to a command_request this agent sent."""
    return message.type in ANSWERS and facts is not None and facts.to_command


def _decide_command(facts: CommandFacts, tiebreak: Callable[[], float]) -> Plan:
    if facts.command is None:
        # An invalid payload: the runner answers INVALID_MESSAGE from its own parse.
        return Plan(step=Step.SERVE)
    if facts.canceled_before:
        # Its cancel overtook it (an offline child, a re-delivery): the cancel wins.
        return Plan(step=Step.CANCELED_BEFORE, reason="canceled before it arrived: not started")
    if facts.stopping:
        return Plan(step=Step.STOPPING, reason="agent is stopping")
    if facts.deadline_passed:
        # Its master gave up at that deadline: running it now is work nobody awaits.
        return Plan(step=Step.EXPIRED, reason="after its deadline: not started")
    if facts.local is not Local.NONE:
        now = facts.slot_free
        return Plan(
            step=Step.SERVE, start_now=now, run_early=now and facts.local is Local.IDEMPOTENT
        )
    child, code = choose_child(facts.command, facts.children, load=facts.load, tiebreak=tiebreak)
    if child is None:
        return Plan(step=Step.UNROUTABLE, code=code or ErrorCode.NO_ROUTE)
    return Plan(step=Step.DELEGATE, child=child)


def _decide_answer(message: VOXMessage, facts: AnswerFacts) -> Plan:
    # An answer to a command is never acknowledged: its requester re-sends the request until
    # it has one, and the answerer replays what it recorded (docs/messages.md).
    acknowledge = not _answers_command(message, facts)
    if facts.waiter is Waiter.ENDED:
        reason = f"answers {message.reply_to}, which ended {facts.ended_as} here"
        return Plan(step=Step.LATE, reason=reason, ended=facts.ended_as, acknowledge=acknowledge)
    if facts.waiter is Waiter.RELAY and message.type in ANSWERS and not facts.refused_unrecorded:
        return Plan(step=Step.RELAY_ANSWER, acknowledge=acknowledge)
    if facts.waiter in (Waiter.CALLER, Waiter.RELAY):
        # A relay's child refused the work unrecorded: its waiter sends it to another child.
        return Plan(step=Step.ANSWER, acknowledge=acknowledge)
    return Plan(step=Step.EVENT, acknowledge=acknowledge)


_CANCEL_BY_STATE = {
    "received": CancelAction.NEVER_START,
    "started": CancelAction.STOP,
    "working": CancelAction.STOP,
    "delegated": CancelAction.PASS_DOWN,
    "answering": CancelAction.FINISHING,
}


def _decide_cancel(target: str) -> Plan:
    if target in FINAL_STATES:
        reason = f"already {target}: nothing to cancel"
        return Plan(step=Step.CANCEL, cancel=CancelAction.FINAL, ended=target, reason=reason)
    action = _CANCEL_BY_STATE.get(target, CancelAction.REMEMBER)
    return Plan(step=Step.CANCEL, cancel=action)
