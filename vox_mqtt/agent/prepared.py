"""What an executor stages for the pipeline's one commit of an inbound message.

A `Staged` says how the message itself is recorded (its action, or nothing at all), the
rows its plan adds to that commit and the one message the commit puts in the outbox,
checked but not yet sent: the pipeline commits them together, then hands the staged plan
back to the same executor to execute, or to drop when the commit fails (docs/ledger.md,
rows that commit together; agent/executors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from uuid import UUID

from vox_mqtt.agent.outbox import Outgoing
from vox_mqtt.agent.requests import Served
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_RESULT,
    CommandError,
    CommandResult,
    ErrorCode,
    VOXMessage,
)
from vox_mqtt.protocol.topics import InboxTopic
from vox_mqtt.transport.session import Inbound

__all__ = [
    "NotStarted",
    "Row",
    "Staged",
    "nothing_recorded",
    "refused_unrecorded",
    "relayed_details",
]

Row = tuple[VOXMessage, LedgerAction, str | None]  # (message, action, outcome), one ledger row


@dataclass(kw_only=True, eq=False)
class Staged:
    """A committed-to-be plan: its rows, its outbox message, the request record it touches."""

    # How the message itself is recorded: False, not at all (nothing is acknowledged either).
    commits: bool = True
    action: LedgerAction = LedgerAction.RECEIVED
    outcome: str | None = None  # with a refusal: its code
    reason: str | None = None  # with a refusal: why
    # Nothing waits for its row (an ack's): it joins the next commit (record_received_later).
    later: bool = False
    # What its commit takes out of the outbox; None: an answer's request (the pipeline's).
    outbox_done: UUID | None = None
    # Done once the commit is queued, before it is durable (docs/ledger.md, what may).
    beside: Callable[[], None] | None = None
    served: Served | None = None  # a command_request accepted by this commit
    relayed: Served | None = None  # RELAY_ANSWER: the command whose answer commits here
    rows: list[Row] = field(default_factory=list)
    outgoing: Outgoing | None = None  # whole in the outbox with this commit
    implied: bool = False  # an answer that commits with the request stands for its ack
    answer_code: str | None = None  # an error answer staged here: its code, for the counters
    ack: VOXMessage | None = None  # the ack the message is owed, committed with it (pipeline)
    cause: UUID | None = None  # the child whose event this is, in its backlog until handled
    canceled: Served | None = None  # CANCEL: the command whose CANCELED answer commits here
    canceled_down: tuple[UUID, UUID] | None = None  # CANCEL: (child, downstream request)


@dataclass(frozen=True, slots=True)
class Taken:
    """One inbox message as the pipeline took it in: parsed, from this inbox topic."""

    message: VOXMessage
    inbound: Inbound
    inbox: InboxTopic

    @property
    def topic(self) -> str:
        """Return the topic it came on, as received."""
        return self.inbound.topic


P = TypeVar("P", contravariant=True)


class Executor(Protocol[P]):
    """The part that carries out one kind of plan, around the pipeline's one commit.

    The executor table (agent/executors.py) names one for every plan type.
    """

    async def stage(self, taken: Taken, plan: P) -> Staged:
        """Stage what the plan adds to the message's commit; nothing is sent yet."""
        ...

    async def execute(self, taken: Taken, plan: P, staged: Staged) -> None:
        """Carry the plan out: its commit is durable (or it records nothing at all)."""
        ...

    def drop(self, taken: Taken, plan: P, staged: Staged) -> None:
        """Give back what stage took: the commit failed, nothing of it was recorded."""
        ...


def nothing_recorded() -> Staged:
    """A staged plan that records nothing and acknowledges nothing (a refusal not recorded)."""
    return Staged(commits=False)


class NotStarted(CommandError):
    """The answer to a command whose deadline passed before it could start: it ends expired."""


def refused_unrecorded(outcome: CommandResult | CommandError) -> bool:
    """Tell whether a child refused the work because it could not record it (did nothing)."""
    return isinstance(outcome, CommandError) and outcome.code == ErrorCode.LEDGER_UNAVAILABLE


def relayed_details(
    reply: VOXMessage, name: str, *, handled_by: UUID
) -> CommandResult | CommandError | None:
    """This agent's answer for a child's: it answers for the work (seed 000); None if malformed."""
    try:
        if reply.type == MSG_COMMAND_RESULT:
            result = reply.payload_as(CommandResult)
            return CommandResult(
                command=name,
                result=result.result,
                summary=result.summary,
                handled_by=handled_by,
            )
        error = reply.payload_as(CommandError)
        return CommandError(code=error.code, error=error.error, command=name)
    except ValueError:
        return None
