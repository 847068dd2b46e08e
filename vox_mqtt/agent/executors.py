"""The executor table: every plan type (agent/plan.py) to the one part that carries it out.

Every executor has one shape (agent/prepared.py `Executor`): `stage` (what the plan adds to
the message's commit, and how the message itself is recorded: `Staged`), `execute` (the
plan carried out once that commit is durable) and `drop` (what stage took, given back when
the commit fails). The pipeline (agent/inbound.py) is parse, admit, decide, stage, commit,
execute, and names no step: it asks this table. Only agent/plan.py and this table tell one
plan type from another (tests/unit/test_architecture.py guards it).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from vox_mqtt.agent.lifecycle import Lifecycle
from vox_mqtt.agent.lifecyclesteps import (
    CancelEndStep,
    CancelInFlightStep,
    CancelUnknownStep,
    ProgressStep,
    StatusStep,
)
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.plan import (
    Answer,
    CancelFinished,
    CancelFinishing,
    CancelInFlight,
    CancelUnknown,
    Duplicate,
    Event,
    Late,
    Plan,
    Progress,
    Reject,
    RelayAnswer,
    Replay,
    Retained,
    SettleAck,
    Status,
    Unrecordable,
)
from vox_mqtt.agent.ports import Settings
from vox_mqtt.agent.prepared import Executor
from vox_mqtt.agent.refusals import Refusals, RejectStep, RetainedStep, UnrecordableStep
from vox_mqtt.agent.replies import (
    AnswerStep,
    DuplicateStep,
    EventStep,
    LateStep,
    RelayAnswerStep,
    ReplayStep,
    RoleHandoff,
    SettleAckStep,
)
from vox_mqtt.agent.runner import CommandRunner
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics

__all__ = ["PLAN_TYPES", "ExecutorTable", "executor_table"]

PLAN_TYPES: tuple[type, ...] = typing.get_args(Plan)


class ExecutorTable:
    """One executor per plan type, every type covered (checked when the agent is built)."""

    def __init__(self, entries: Mapping[type, Executor[Any]]) -> None:
        missing = [t.__name__ for t in PLAN_TYPES if t not in entries]
        extra = [t.__name__ for t in entries if t not in PLAN_TYPES]
        if missing or extra:
            raise TypeError(f"executor table: missing {missing}, not plans {extra}")
        self._entries = dict(entries)

    def of(self, plan: Plan) -> Executor[Any]:
        """Return the executor of a plan."""
        return self._entries[type(plan)]


def executor_table(
    *,
    settings: Settings,
    ledger: VOXAgentMemory,
    metrics: AgentMetrics,
    outbox: Outbox,
    runner: CommandRunner,
    lifecycle: Lifecycle,
    refusals: Refusals,
    roles: RoleHandoff,
    leaves_outbox: Callable[[UUID], UUID | None],
) -> ExecutorTable:
    """Build the table of an agent's executors (once, by its pipeline)."""
    cancel_end = CancelEndStep(lifecycle)
    return ExecutorTable(
        {
            # Refused: not admitted (agent/refusals.py).
            Reject: RejectStep(refusals),
            Retained: RetainedStep(refusals),
            Unrecordable: UnrecordableStep(refusals),
            # Copies and acks (agent/replies.py).
            Duplicate: DuplicateStep(metrics=metrics),
            Replay: ReplayStep(outbox=outbox, metrics=metrics),
            SettleAck: SettleAckStep(outbox=outbox, refusals=refusals, leaves_outbox=leaves_outbox),
            # A command_request (agent/commandsteps.py, held by the runner, which asks them
            # for a command's answer).
            **runner.steps,
            # Answers and events (agent/replies.py).
            RelayAnswer: RelayAnswerStep(runner=runner, roles=roles),
            Answer: AnswerStep(outbox=outbox, roles=roles),
            Late: LateStep(settings=settings, ledger=ledger),
            Event: EventStep(settings=settings, roles=roles, metrics=metrics),
            # A request's life (agent/lifecyclesteps.py).
            CancelInFlight: CancelInFlightStep(lifecycle),
            CancelFinished: cancel_end,
            CancelFinishing: cancel_end,
            CancelUnknown: CancelUnknownStep(lifecycle, refusals),
            Status: StatusStep(lifecycle),
            Progress: ProgressStep(lifecycle),
        }
    )
