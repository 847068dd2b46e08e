"""The one owner of every request an agent sent or serves: its state, its child, its answer.

A request this agent sent is a `TrackedRequest` (agent/tracking.py, the bounded view the
outbox moves and callers wait on). A command this agent serves is a `Served` record, from
its commit to its answer: whether it holds a handler slot, the handler started early, the
child it went to and the downstream request, the answer prepared to commit with a child's.
Its state is the request's state as the wire names it (protocol/requeststates.py); each
state it reaches is a ledger row (ledger/actions.py, `row_of`: `working` is written
`started`) written in the commit that makes it true (docs/ledger.md); a restart rebuilds
what was still open from those rows (resume).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final
from uuid import UUID

from vox_mqtt.agent.plan import CommandPlan
from vox_mqtt.agent.requestevents import EventQueue
from vox_mqtt.agent.tracking import RequestTracker, SentMoved, SentProgress, TrackedRequest
from vox_mqtt.ledger.actions import AFTER_CANCEL
from vox_mqtt.protocol.lifecycle import CommandProgress
from vox_mqtt.protocol.messages import CommandError, CommandResult, ErrorCode, VOXMessage
from vox_mqtt.protocol.requeststates import FINAL_STATES, RequestState

if TYPE_CHECKING:
    from vox_mqtt.agent.outbox import Outgoing

__all__ = [
    "ANSWER_MOVES",
    "CURRENT_REQUEST",
    "Answering",
    "ProgressWindow",
    "RequestEvent",
    "Requests",
    "Served",
    "ServedMoved",
    "answer_move",
    "ended_by",
]


class Answering(StrEnum):
    """How far a served command's answer is: one of its record's two states, beside `state`.

    OPEN: nobody has taken the right to answer it yet. CLAIMED: one part took it and sends
    the answer (its own task, a cancel, a stop). STAGED: its answer rides a commit, its own
    record's (a quick idempotent answer) or its child's answer's (relayed), and only its
    publish is left once that commit is durable. A final `state` ends it.
    """

    OPEN = "open"
    CLAIMED = "claimed"
    STAGED = "staged"


# Every move of a served command's answer: (where it is, the move) -> where it goes. A move
# missing here is refused (`answer_move` says None): nothing else writes `answer_state`.
ANSWER_MOVES: Final[dict[tuple[Answering, str], Answering]] = {
    (Answering.OPEN, "claim"): Answering.CLAIMED,
    (Answering.CLAIMED, "release"): Answering.OPEN,  # its staged answer did not commit
    (Answering.OPEN, "stage"): Answering.STAGED,  # quick: committed with its record
    (Answering.CLAIMED, "stage"): Answering.STAGED,  # relayed: committed with the child's
    (Answering.STAGED, "unstage"): Answering.OPEN,  # that commit failed: nothing recorded
}


def answer_move(current: Answering, move: str) -> Answering | None:
    """Where a served command's answer goes on `move` from `current`; None: not allowed."""
    return ANSWER_MOVES.get((current, move))


@dataclass(eq=False, kw_only=True)
class ProgressWindow:
    """A served command's progress going up: its sequence and what waits for the window.

    The progress reporter's own (agent/progress.py), hung on the record it reports on.
    """

    seq: int = 0
    # When the window last opened: its first report waits one interval, so a request
    # answered within it sends none (a quick command costs its master nothing more).
    last: float = field(default_factory=time.monotonic)
    pending: CommandProgress | None = None
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, kw_only=True)
class Served:
    """One command this agent serves, from its commit to its answer."""

    request: VOXMessage
    plan: CommandPlan  # decided at its arrival, or again on a new fact (replan)
    refusal: CommandError | None = None  # a child's unrecorded refusal, the last one
    # RECEIVED (recorded and acknowledged, not started: it waits for a slot), WORKING (its
    # handler runs here) or DELEGATED (its downstream request went to a child), then one
    # end: COMPLETED, FAILED, EXPIRED (it came after its deadline: never started) or
    # CANCELED (its master canceled it, docs/messages.md). Never CANCELING: a cancel passed
    # down is the flag `canceling` beside DELEGATED.
    state: RequestState = RequestState.RECEIVED
    history: list[tuple[RequestState, float]] = field(default_factory=list)
    slot: bool = False  # holds a handler slot (taken before its commit: Plan.start_now)
    early: asyncio.Task[CommandResult | CommandError] | None = None  # idempotent, started early
    # An answer whose "sent" row committed with this command's record (a quick idempotent
    # answer) or with its child's answer (RELAY_ANSWER): only its publish is left.
    answer: Outgoing | None = None
    answer_end: RequestState | None = None  # the command's end with that answer (ended_by)
    answer_code: str | None = None  # its error code, for a command_error
    answer_durable: asyncio.Future[bool] | None = None  # a relayed answer's commit outcome
    child: UUID | None = None  # DELEGATED: the child it went to
    downstream: TrackedRequest | None = None  # DELEGATED: the request sent to that child
    answer_state: Answering = Answering.OPEN  # moved only by answer_move (Requests)
    task: asyncio.Task[None] | None = None  # the task serving it, cancelled by a cancel
    # Whether its record committed (True) or its commit failed (False): awaited, never
    # polled, by a cancel that came while it committed (agent/lifecycle.py).
    recorded: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    progress: ProgressWindow | None = None  # once it reported progress (progress_window)
    # Delegated, and its master's cancel passed down (its `canceling` row committed): it
    # waits for its child's answer, the confirmation it relays up (docs/messages.md).
    canceling: bool = False

    @property
    def message_id(self) -> UUID:
        """Return the id of the command_request served."""
        return self.request.message_id

    @property
    def answering(self) -> bool:
        """Return whether its answer is taken (claimed or staged): no other part may send one."""
        return self.answer_state is not Answering.OPEN

    @property
    def final(self) -> bool:
        """Return whether it has been answered (completed, failed, expired or canceled)."""
        return self.state in FINAL_STATES

    @property
    def down(self) -> tuple[UUID, UUID] | None:
        """Return (child, downstream request id) while its child's answer is due, else None."""
        if self.child is None or self.downstream is None:
            return None
        return self.child, self.downstream.message_id

    def outcome_of(self, end: RequestState) -> str | None:
        """The `outcome` of its end row: `after_cancel` for an end other than `canceled` that
        came after its cancel passed down, CANCELED for `canceled` (docs/ledger.md)."""
        if end == RequestState.CANCELED:
            return str(ErrorCode.CANCELED)
        return AFTER_CANCEL if self.canceling else None


@dataclass(frozen=True, slots=True)
class ServedMoved:
    """A command this agent serves reached a state (Requests.move): an event on the queue."""

    served: Served
    state: RequestState


# What the agent's one queue of request events carries (agent/requestevents.py).
RequestEvent = ServedMoved | SentMoved | SentProgress


def ended_by(details: CommandResult | CommandError) -> RequestState:
    """The end an answer gives a command: a `CANCELED` error ends it `canceled`.

    A level that passed its cancel down relays its child's `CANCELED` answer, the child's
    confirmation that nothing of it runs there or below (docs/messages.md).
    """
    if isinstance(details, CommandResult):
        return RequestState.COMPLETED
    return RequestState.CANCELED if details.code == ErrorCode.CANCELED else RequestState.FAILED


CURRENT_REQUEST: ContextVar[Served | None] = ContextVar("vox_current_request", default=None)
"""The command a handler serves, set in the task that runs it (the handle's progress())."""


class Requests:
    """Every request this agent sent (the tracker) or serves (Served), by id; one truth each."""

    def __init__(self, sent: RequestTracker) -> None:
        self.sent = sent
        self._served: dict[UUID, Served] = {}
        self._by_downstream: dict[UUID, Served] = {}  # downstream request id -> its command
        self._load: dict[UUID, int] = {}  # child id -> commands delegated to it, not answered
        self._idle = asyncio.Event()
        self._idle.set()
        # Each state a served command reaches is an event on the tracker's queue, read by the
        # agent's one reader (agent/requestevents.py): the owner calls nobody.
        self.events: EventQueue[RequestEvent] = sent.events

    # --- served commands ------------------------------------------------------------------

    def open(self, request: VOXMessage, plan: CommandPlan, *, recorded: bool = False) -> Served:
        """Start serving a command_request about to be recorded (or recorded already)."""
        served = Served(request=request, plan=plan)
        if recorded:
            served.recorded.set_result(True)
        served.history.append((served.state, time.monotonic()))
        self._served[request.message_id] = served
        self._idle.clear()
        return served

    def committed(self, served: Served) -> None:
        """Its record is durable: it is accepted here."""
        if not served.recorded.done():
            served.recorded.set_result(True)

    def drop(self, served: Served) -> None:
        """Forget a command whose record never committed: it was never accepted here."""
        if not served.recorded.done():
            served.recorded.set_result(False)
        if self._served.get(served.message_id) is served:
            del self._served[served.message_id]
        self._unlink(served)
        if not self._served:
            self._idle.set()

    def move(self, served: Served, state: RequestState) -> None:
        """Record where a served command stands now (its ledger row is the caller's)."""
        if served.final:
            return
        served.state = state
        served.history.append((state, time.monotonic()))
        self.events.put(ServedMoved(served, state))
        if state in FINAL_STATES:
            self._unlink(served)
            if self._served.get(served.message_id) is served:
                del self._served[served.message_id]
            if not self._served:
                self._idle.set()

    def replan(self, served: Served, plan: CommandPlan) -> None:
        """Carry a command on by the plan decided again for it (CommandRunner.serve)."""
        served.plan = plan

    def delegate(self, served: Served, child: UUID, downstream: TrackedRequest) -> None:
        """Record that a command went to a child as this downstream request."""
        self._unlink(served)
        served.child, served.downstream = child, downstream
        self._by_downstream[downstream.message_id] = served
        self._load[child] = self._load.get(child, 0) + 1
        self.move(served, RequestState.DELEGATED)

    def undelegate(self, served: Served) -> None:
        """The child's part is over (answered, failed or given up): it no longer counts."""
        self._unlink(served)

    def _unlink(self, served: Served) -> None:
        if served.downstream is not None:
            self._by_downstream.pop(served.downstream.message_id, None)
            served.downstream = None
        if served.child is not None:
            left = self._load.get(served.child, 0) - 1
            if left > 0:
                self._load[served.child] = left
            else:
                self._load.pop(served.child, None)
            served.child = None

    def relaying(self, downstream_id: UUID) -> Served | None:
        """Return the command a downstream request serves, while its child's answer is due."""
        served = self._by_downstream.get(downstream_id)
        if served is None or served.downstream is None or served.downstream.final:
            return None
        return served

    def claim_answer(self, served: Served) -> bool:
        """Take the right to answer a command; False: someone answers it already (a stop)."""
        return not served.final and self._answer_moves(served, "claim")

    def _answer_moves(self, served: Served, move: str) -> bool:
        """Move a command's answer as ANSWER_MOVES allows; False (nothing changed): not allowed."""
        to = answer_move(served.answer_state, move)
        if to is None:
            return False
        served.answer_state = to
        return True

    # --- transitions of a served command's record (its only writer; guarded in
    # tests/unit/test_architecture.py) ---------------------------------------------------------

    def release_answer(self, served: Served) -> None:
        """Give the right to answer back (its staged answer was not committed): it goes on."""
        self._answer_moves(served, "release")

    def took_slot(self, served: Served, taken: bool = True) -> None:
        """Record that a command holds a handler slot (or gave it back)."""
        served.slot = taken

    def started_early(
        self, served: Served, task: asyncio.Task[CommandResult | CommandError]
    ) -> None:
        """Record the task of an idempotent handler started while its record commits."""
        served.early = task

    def serving(self, served: Served, task: asyncio.Task[None]) -> None:
        """Record the task that answers a command (a cancel cancels it)."""
        served.task = task

    def answer_prepared(
        self, served: Served, answer: Outgoing, end: RequestState, code: str | None
    ) -> None:
        """Record the answer that commits with the command's record or its child's answer."""
        moved = self._answer_moves(served, "stage")
        assert moved, f"an answer staged from {served.answer_state}"
        served.answer, served.answer_end, served.answer_code = answer, end, code

    def answer_unprepared(self, served: Served) -> None:
        """Its prepared answer's commit failed: nothing of it was recorded; it goes on."""
        served.answer, served.answer_end, served.answer_code = None, None, None
        self._answer_moves(served, "unstage")
        self.answer_committed(served, False)

    def answer_committed(self, served: Served, durable: bool) -> None:
        """Tell the command's task whether the answer relayed with its child's committed."""
        if served.answer_durable is not None and not served.answer_durable.done():
            served.answer_durable.set_result(durable)

    def relaying_answer(self, served: Served) -> asyncio.Future[bool]:
        """The child's answer commits with this agent's: the future says if it did."""
        served.answer_durable = asyncio.get_running_loop().create_future()
        return served.answer_durable

    def passing_cancel_down(self, served: Served, passing: bool = True) -> None:
        """Its master's cancel passes down (or, its commit failed, does not after all)."""
        served.canceling = passing

    def progress_window(self, served: Served) -> ProgressWindow:
        """The window of a command's progress going up, opened at its first report."""
        if served.progress is None:
            served.progress = ProgressWindow()
        return served.progress

    def refused_by_child(self, served: Served, refusal: CommandError) -> None:
        """A child refused it unrecorded: the answer if no other child can take it."""
        served.refusal = refusal

    def get(self, request_id: UUID) -> Served | None:
        """Return the command being served with this id, if any."""
        return self._served.get(request_id)

    def unanswered(self) -> list[Served]:
        """Return the commands still being served whose answer nobody sends yet."""
        return [s for s in self._served.values() if not s.answering]

    def count(self, state: RequestState) -> int:
        """Return how many commands served here stand in this state now."""
        return sum(1 for s in self._served.values() if s.state is state)

    @property
    def in_flight(self) -> int:
        """Return how many commands this agent is serving."""
        return len(self._served)

    @property
    def load(self) -> Mapping[UUID, int]:
        """Return the commands delegated to each child and not answered yet (read-only)."""
        return MappingProxyType(self._load)

    async def wait_idle(self) -> None:
        """Wait until no command is being served."""
        await self._idle.wait()
