"""The executors of a request's life over the wire: a cancel, a status query, a progress.

Each has the executor table's shape (agent/executors.py); what they do is the Lifecycle's
(agent/lifecycle.py), and docs/messages.md ("A request's life") is the contract.
"""

from __future__ import annotations

from vox_mqtt.agent.lifecycle import Lifecycle
from vox_mqtt.agent.plan import (
    CancelFinished,
    CancelFinishing,
    CancelInFlight,
    CancelUnknown,
    Progress,
    Status,
)
from vox_mqtt.agent.prepared import Staged, Taken, nothing_recorded
from vox_mqtt.agent.refusals import Refusals

__all__ = [
    "CancelEndStep",
    "CancelInFlightStep",
    "CancelUnknownStep",
    "ProgressStep",
    "StatusStep",
]


class CancelInFlightStep:
    """Cancel a request waiting, running or delegated here: its CANCELED answer and its
    "canceled" row commit with the cancel; then it stops, and its child is told."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    async def stage(self, taken: Taken, plan: CancelInFlight) -> Staged:
        return self._lifecycle.stage_cancel(taken.message)

    async def execute(self, taken: Taken, plan: CancelInFlight, staged: Staged) -> None:
        self._lifecycle.cancel_in_task(taken.message, staged, unknown=False, wait=False)

    def drop(self, taken: Taken, plan: CancelInFlight, staged: Staged) -> None:
        self._lifecycle.unstage_cancel(staged)


class CancelEndStep:
    """Report the end a request already reached here (or reaches as its answer goes)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    async def stage(self, taken: Taken, plan: CancelFinished | CancelFinishing) -> Staged:
        return Staged()

    async def execute(
        self, taken: Taken, plan: CancelFinished | CancelFinishing, staged: Staged
    ) -> None:
        wait = plan.wait_for_answer
        self._lifecycle.cancel_in_task(taken.message, staged, unknown=False, wait=wait)

    def drop(self, taken: Taken, plan: CancelFinished | CancelFinishing, staged: Staged) -> None:
        """Nothing was taken for it."""


class CancelUnknownStep:
    """Remember the cancel of a request not received (yet): it never starts when it comes.

    Beyond its sender's budget it is acknowledged and answered "unknown", unrecorded and
    not remembered (docs/security.md, "Costs of a peer's messages").
    """

    def __init__(self, lifecycle: Lifecycle, refusals: Refusals) -> None:
        self._lifecycle = lifecycle
        self._refusals = refusals

    async def stage(self, taken: Taken, plan: CancelUnknown) -> Staged:
        if plan.beyond_budget:
            return nothing_recorded()
        # From now: the request, if it comes while this commits, never starts.
        self._lifecycle.remember(taken.message)
        return Staged()

    async def execute(self, taken: Taken, plan: CancelUnknown, staged: Staged) -> None:
        if not staged.commits:
            await self._refusals.answer_unrecorded(taken.message)
            return
        self._lifecycle.cancel_in_task(taken.message, staged, unknown=True, wait=False)

    def drop(self, taken: Taken, plan: CancelUnknown, staged: Staged) -> None:
        if staged.commits:
            self._lifecycle.forget(taken.message)


class StatusStep:
    """Answer the master's status_query from the ledger (and the child)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    async def stage(self, taken: Taken, plan: Status) -> Staged:
        return Staged()

    async def execute(self, taken: Taken, plan: Status, staged: Staged) -> None:
        self._lifecycle.status(taken.message)

    def drop(self, taken: Taken, plan: Status, staged: Staged) -> None:
        """Nothing was taken for it."""


class ProgressStep:
    """A child's command_progress: told to waiters, passed up by a relay."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    async def stage(self, taken: Taken, plan: Progress) -> Staged:
        return Staged()

    async def execute(self, taken: Taken, plan: Progress, staged: Staged) -> None:
        self._lifecycle.progress(taken.message)

    def drop(self, taken: Taken, plan: Progress, staged: Staged) -> None:
        """Nothing was taken for it."""
