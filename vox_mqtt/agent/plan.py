"""One plan per inbound inbox message: what it means, decided once by a pure function.

The plan is a tagged union: one frozen type per step, each with only its own fields. The
pipeline gathers what the decision reads into `Facts` (the router and the fleet view are
consulted there, once), calls `decide`, then hands the plan to the one executor the
executor table (agent/executors.py) names for its type: the executor stages the rows it
adds, the pipeline commits them with the message's own, and the executor carries the plan
out (docs/architecture.md, one command from bytes to handler and back). What an executor
learns later that changes the decision (the agent began stopping, a child refused the work
unrecorded) comes back here as a fact (`decide_command`); no executor picks a child itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar
from uuid import UUID

from vox_mqtt.agent.rules import choose_child, verify
from vox_mqtt.observe.status import AgentLiveness
from vox_mqtt.protocol.lifecycle import (
    FINAL_STATES,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
    RequestState,
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

if TYPE_CHECKING:
    from vox_mqtt.agent.roles import Handler

__all__ = [
    "ANSWERS",
    "Admission",
    "Answer",
    "AnswerFacts",
    "Answered",
    "CancelFacts",
    "CancelFinished",
    "CancelFinishing",
    "CancelInFlight",
    "CancelUnknown",
    "CanceledBefore",
    "CommandFacts",
    "CommandPlan",
    "Delegate",
    "Duplicate",
    "Event",
    "Expired",
    "Facts",
    "Late",
    "Local",
    "Plan",
    "Progress",
    "Reject",
    "RelayAnswer",
    "Replay",
    "Retained",
    "Serve",
    "SettleAck",
    "Status",
    "Stopping",
    "Unrecordable",
    "Unroutable",
    "Waiter",
    "acts",
    "admit",
    "decide",
    "decide_command",
    "shown",
]

ANSWERS = frozenset({MSG_COMMAND_RESULT, MSG_COMMAND_ERROR})


# --- the steps ---------------------------------------------------------------------------------
# `acknowledge`: whether the message gets a message_acknowledged (a ClassVar where the step
# fixes it, a field where the facts do). `acts` and `shown`, below the union, say what else
# each step means.


@dataclass(frozen=True, kw_only=True)
class Reject:
    """Not accepted (docs/topics.md): recorded rejected, answered if a peer's."""

    reason: str
    code: ErrorCode = ErrorCode.UNAUTHORIZED_SOURCE
    acknowledge: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Retained:
    """A retained message in an inbox: recorded, never acted on (docs/broker.md)."""

    reason: str
    acknowledge: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Unrecordable:
    """The ledger cannot write: refused, never acknowledged; a command hears why."""

    reason: str
    acknowledge: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Duplicate:
    """Seen before: acknowledged again (unless an answer or an ack), never acted on again."""

    acknowledge: bool = True


@dataclass(frozen=True, kw_only=True)
class Replay:
    """A re-sent command answered here: its recorded answer goes again and stands for the ack."""

    answer: bytes  # the answer held for replay, as published (docs/messages.md)
    acknowledge: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class SettleAck:
    """An acknowledgement of a message this agent sent: it stops re-sending it."""

    acknowledge: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Serve:
    """A command a role here serves."""

    handler: Handler  # the role's handler (the router, asked once, in the facts)
    start_now: bool = False  # take a free slot and commit "started" with "received"
    run_early: bool = False  # idempotent: its handler starts before the commit
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Delegate:
    """A command for a child: the child chosen here, by `choose_child`."""

    child: UUID
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Unroutable:
    """A command neither a role here nor a healthy child serves: answered with `code`."""

    code: ErrorCode
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Expired:
    """A command past its deadline: answered TIMEOUT, never started."""

    reason: str
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Stopping:
    """A command while the agent stops: answered SHUTTING_DOWN."""

    reason: str
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class CanceledBefore:
    """A command whose master's cancel came first: answered CANCELED, never started."""

    reason: str
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class RelayAnswer:
    """A child's answer to a command delegated from here: answered upstream in its commit."""

    acknowledge: bool = True


@dataclass(frozen=True, kw_only=True)
class Answer:
    """An answer to a request a caller here awaits (or a relay's child refused unrecorded)."""

    acknowledge: bool = True


@dataclass(frozen=True, kw_only=True)
class Late:
    """An answer to a request that already ended here: recorded late, never its outcome."""

    reason: str
    ended: str  # how the request it names ended here
    acknowledge: bool = True


@dataclass(frozen=True, kw_only=True)
class Event:
    """Anything else: listeners and event handlers."""

    acknowledge: bool = True


# A request's life (docs/messages.md): what a cancel_request does, by where its request stands.


@dataclass(frozen=True, kw_only=True)
class CancelInFlight:
    """The request waits for a slot, runs, or went to a child: it stops (and is passed down)."""

    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class CancelFinished:
    """The request already ended here: the report gives its final state."""

    ended: str
    reason: str
    wait_for_answer: ClassVar[bool] = False
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class CancelFinishing:
    """The request's answer is being sent: the report waits for its end."""

    wait_for_answer: ClassVar[bool] = True
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class CancelUnknown:
    """The request was not received (yet): remembered, so it never starts when it comes."""

    beyond_budget: bool = False  # its sender's budget is spent: answered unknown, unrecorded
    acknowledge: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Status:
    """The master's status_query: answered from the ledger (and the child)."""

    acknowledge: ClassVar[bool] = False  # its status_report stands for the ack


@dataclass(frozen=True, kw_only=True)
class Progress:
    """A child's command_progress: told to waiters, passed up by a relay."""

    acknowledge: ClassVar[bool] = False  # fire and forget (docs/messages.md)


Plan = (
    Reject
    | Retained
    | Unrecordable
    | Duplicate
    | Replay
    | SettleAck
    | Serve
    | Delegate
    | Unroutable
    | Expired
    | Stopping
    | CanceledBefore
    | RelayAnswer
    | Answer
    | Late
    | Event
    | CancelInFlight
    | CancelFinished
    | CancelFinishing
    | CancelUnknown
    | Status
    | Progress
)
"""The decision about one inbound message; effects follow it, none are in it."""

CommandPlan = Serve | Delegate | Unroutable | Expired | Stopping | CanceledBefore
"""What a command_request means here (decide_command): the plan its `Served` record carries."""

# Recorded as received and acted on: not a copy, a refusal or an unrecordable message.
_NOT_ACTED_ON: frozenset[type[Plan]] = frozenset(
    {Reject, Retained, Unrecordable, Duplicate, Replay}
)
# What the agent's listeners (VOXAgent.listeners) never see: besides those, an ack (the
# agent's own business) and a late answer (never a request's outcome nor a role's to handle).
_NOT_SHOWN: frozenset[type[Plan]] = _NOT_ACTED_ON | {SettleAck, Late}


def acts(plan: Plan) -> bool:
    """Tell whether a plan's message is recorded as received and acted on."""
    return type(plan) not in _NOT_ACTED_ON


def shown(plan: Plan) -> bool:
    """Tell whether the agent's listeners see a plan's message (once it is durable)."""
    return type(plan) not in _NOT_SHOWN


# --- the facts ---------------------------------------------------------------------------------


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
    ENDED = "ended"  # it already ended here (expired, failed, canceled): an answer now is late


@dataclass(frozen=True, kw_only=True)
class CommandFacts:
    """What deciding a command reads of the agent: gathered once, only for commands."""

    command: str
    deadline_passed: bool
    stopping: bool
    slot_free: bool  # a handler slot can be taken at once
    local: Local
    handler: Handler | None = None  # the role's, when `local` is not NONE
    # This agent's children as the fleet view has them, and requests in flight per child.
    children: Sequence[AgentLiveness | None] = ()
    load: Mapping[UUID, int] = field(default_factory=dict)
    canceled_before: bool = False  # its master's cancel_request came before it
    # Children that refused it unrecorded already (they did nothing): never chosen again.
    refused_by: frozenset[UUID] = frozenset()


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
class CancelFacts:
    """What deciding a cancel_request reads: where the request it names stands here."""

    # A served record's state (RequestState), "answering", the last state its rows give
    # (a `canceling` one as "delegated": its child's answer is due), or "unknown".
    target: str
    # For a request not received: whether its sender may still have one remembered
    # (docs/security.md, "Costs of a peer's messages").
    within_budget: bool = True


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
    held: bytes | None = None  # with Answered.HELD: the answer held for replay
    withheld: bool = False  # that answer waits: the handler its cancel cut still runs
    command: CommandFacts | None = None  # for a command_request
    answer: AnswerFacts | None = None  # for a message with reply_to
    cancel: CancelFacts | None = None  # for a cancel_request


# --- the decisions -----------------------------------------------------------------------------


def admit(
    message: VOXMessage, topic: InboxTopic, facts: Admission
) -> Reject | Retained | Unrecordable | None:
    """Decide whether a message may be taken in at all; None: admitted (then `decide`).

    Checked before the ledger is read, in this order: who sent it and where, a retained
    copy, a ledger that cannot record.
    """
    problem = verify(message, topic, me=facts.me, master_id=facts.master_id, peers=facts.peers)
    if problem is not None:
        return Reject(reason=problem)
    if facts.retained:
        return Retained(reason="retained message in an inbox: never executed")
    if facts.write_failure is not None:
        return Unrecordable(reason=facts.write_failure)
    return None


def decide(
    message: VOXMessage, facts: Facts, *, tiebreak: Callable[[], float] = random.random
) -> Plan:
    """Decide what an admitted inbox message means to this agent."""
    if message.type == MSG_ACKNOWLEDGED:
        # An ack is never acknowledged; a second copy of one changes nothing either.
        return Duplicate(acknowledge=False) if facts.duplicate else SettleAck()
    if facts.duplicate:
        return _decide_duplicate(message, facts)
    if message.type == MSG_COMMAND_REQUEST and facts.command is not None:
        return decide_command(facts.command, tiebreak=tiebreak)
    if message.type == MSG_CANCEL_REQUEST and facts.cancel is not None:
        return _decide_cancel(facts.cancel)
    if message.type == MSG_STATUS_QUERY:
        # Its status_report stands for the acknowledgement, as a quick answer does.
        return Status()
    if message.type == MSG_COMMAND_PROGRESS:
        # Fire and forget (docs/messages.md): recorded here, never acknowledged.
        return Progress()
    if message.reply_to is not None and facts.answer is not None:
        return _decide_answer(message, facts.answer)
    return Event()


def _decide_duplicate(message: VOXMessage, facts: Facts) -> Plan:
    """A copy of a message already recorded here: nothing runs again (docs/messages.md)."""
    held = facts.held if facts.answered is Answered.HELD else None
    if message.type == MSG_COMMAND_REQUEST and held is not None:
        if facts.withheld:
            # A CANCELED answer whose cut handler still runs: nothing goes, not even an ack;
            # the requester re-sends, and gets the answer once the handler ended.
            return Duplicate(acknowledge=False)
        # Its requester lacks the answer: the recorded one goes again, same id, and stands
        # for the acknowledgement; the command never runs twice.
        return Replay(answer=held)
    if _answers_command(message, facts.answer):
        # An answer is never acknowledged: a second copy of one is not either.
        return Duplicate(acknowledge=False)
    # Still waiting, running or delegated (its ack again), or answered so long ago that its
    # requester gave up at the deadline (a stray copy): acknowledged again, as any duplicate.
    return Duplicate()


def _answers_command(message: VOXMessage, facts: AnswerFacts | None) -> bool:
    """Tell whether a message is an answer to a command_request this agent sent."""
    return message.type in ANSWERS and facts is not None and facts.to_command


def decide_command(
    facts: CommandFacts, *, tiebreak: Callable[[], float] = random.random
) -> CommandPlan:
    """Decide what a command_request means here: at its arrival, or again on a new fact.

    An executor that learns something the first decision did not know (the agent began
    stopping while the command waited for a slot, a child refused it unrecorded) asks here
    again with that fact, rather than deciding itself.
    """
    if facts.canceled_before:
        # Its cancel overtook it (an offline child, a re-delivery): the cancel wins.
        return CanceledBefore(reason="canceled before it arrived: not started")
    if facts.stopping:
        return Stopping(reason="agent is stopping")
    if facts.deadline_passed:
        # Its master gave up at that deadline: running it now is work nobody awaits.
        return Expired(reason="after its deadline: not started")
    if facts.local is not Local.NONE and facts.handler is not None:
        now = facts.slot_free
        early = now and facts.local is Local.IDEMPOTENT
        return Serve(handler=facts.handler, start_now=now, run_early=early)
    children = [c for c in facts.children if c is None or c.id not in facts.refused_by]
    child, code = choose_child(facts.command, children, load=facts.load, tiebreak=tiebreak)
    if child is None:
        return Unroutable(code=code or ErrorCode.NO_ROUTE)
    return Delegate(child=child)


def _decide_answer(message: VOXMessage, facts: AnswerFacts) -> Plan:
    # An answer to a command is never acknowledged: its requester re-sends the request until
    # it has one, and the answerer replays what it recorded (docs/messages.md).
    acknowledge = not _answers_command(message, facts)
    if facts.waiter is Waiter.ENDED:
        reason = f"answers {message.reply_to}, which ended {facts.ended_as} here"
        return Late(reason=reason, ended=facts.ended_as, acknowledge=acknowledge)
    if facts.waiter is Waiter.RELAY and message.type in ANSWERS and not facts.refused_unrecorded:
        return RelayAnswer(acknowledge=acknowledge)
    if facts.waiter in (Waiter.CALLER, Waiter.RELAY):
        # A relay's child refused the work unrecorded: its waiter sends it to another child.
        return Answer(acknowledge=acknowledge)
    return Event(acknowledge=acknowledge)


_IN_FLIGHT = frozenset({RequestState.RECEIVED, RequestState.WORKING, RequestState.DELEGATED})


def _decide_cancel(facts: CancelFacts) -> Plan:
    target = facts.target
    if target in FINAL_STATES:
        return CancelFinished(ended=target, reason=f"already {target}: nothing to cancel")
    if target in _IN_FLIGHT:
        return CancelInFlight()
    if target == "answering":
        return CancelFinishing()
    return CancelUnknown(beyond_budget=not facts.within_budget)
