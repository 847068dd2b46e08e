"""What the command runner prepares for the pipeline's one commit of an inbound message.

Each holds an outgoing message checked and tracked but not yet recorded: the pipeline commits
its rows with the inbound message's, then the runner publishes it (docs/ledger.md, rows that
commit together).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from uuid import UUID

from vox_mqtt.agent.outbox import Outgoing
from vox_mqtt.protocol.messages import (
    CommandError,
    CommandRequest,
    CommandResult,
    ErrorCode,
    VOXMessage,
)

__all__ = ["Answer", "Delegation", "NotStarted", "QuickAnswer", "refused_unrecorded"]


@dataclass(frozen=True, kw_only=True)
class Delegation:
    """A command bound for a child, its downstream request prepared (prepare_delegation)."""

    child: UUID
    payload: CommandRequest
    outgoing: Outgoing


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A delegated command's answer upstream, prepared with the child's (prepare_relayed_answer)."""

    request: VOXMessage
    outgoing: Outgoing
    end: str  # the command's row: "completed" or "failed"
    code: str | None  # the error code of a command_error
    recorded: asyncio.Future[bool]  # whether its commit reached the disk


class NotStarted(CommandError):
    """The answer to a command whose deadline passed before it could start: it ends expired."""


@dataclass(frozen=True, kw_only=True)
class QuickAnswer:
    """An idempotent command's answer, ready in time to commit with its record (quick_answer)."""

    outgoing: Outgoing
    end: str  # the command's row: "completed" or "failed"
    code: str | None  # the error code of a command_error


def refused_unrecorded(outcome: CommandResult | CommandError) -> bool:
    """Tell whether a child refused the work because it could not record it (did nothing)."""
    return isinstance(outcome, CommandError) and outcome.code == ErrorCode.LEDGER_UNAVAILABLE
