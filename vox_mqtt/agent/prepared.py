"""What the command runner stages for the pipeline's one commit of an inbound message.

A `Staged` holds the rows its plan adds to the message's commit and the one message that
commit puts in the outbox, checked but not yet sent: the pipeline commits them with the
inbound message's rows, then hands the staged plan to the runner to execute, or drops it
in one call when the commit fails (docs/ledger.md, rows that commit together).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

__all__ = ["NotStarted", "Row", "Staged", "refused_unrecorded", "relayed_details"]

Row = tuple[VOXMessage, LedgerAction, str | None]  # (message, action, outcome), one ledger row


@dataclass(kw_only=True, eq=False)
class Staged:
    """A committed-to-be plan: its rows, its outbox message, the request record it touches."""

    served: Served | None = None  # a command_request accepted by this commit
    relayed: Served | None = None  # RELAY_ANSWER: the command whose answer commits here
    rows: list[Row] = field(default_factory=list)
    outgoing: Outgoing | None = None  # whole in the outbox with this commit
    implied: bool = False  # an answer that commits with the request stands for its ack
    canceled: Served | None = None  # CANCEL: the command whose CANCELED answer commits here
    canceled_down: tuple[UUID, UUID] | None = None  # CANCEL: (child, downstream request)


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
