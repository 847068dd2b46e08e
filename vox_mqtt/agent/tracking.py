"""Track every message an agent sends: queued, dispatched, acknowledged, then its end.

The end (completed, failed, expired) is terminal: nothing moves a request out of it, and the
outbox records it in the ledger before a waiter is told (docs/ledger.md, terminal states).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import UUID

from vox_mqtt.agent.quietpeers import Quiet
from vox_mqtt.agent.requestevents import EventQueue
from vox_mqtt.protocol.messages import ErrorCode, VOXMessage

__all__ = [
    "Delivery",
    "Follower",
    "RequestTracker",
    "SentMoved",
    "SentProgress",
    "SentState",
    "TrackedRequest",
]


class SentState(StrEnum):
    """Where a message this agent sent stands: its delivery, then what came back.

    Not a request's state (protocol/requeststates.py, `RequestState`): it is the sender's
    view of one message of any type it tracks (an event, a cancel, a status query or report,
    an answer published once, as well as a command_request), and it says what the sender
    has heard, not what the receiver did. `queued`, `dispatched` and `acknowledged` are
    delivery, no request's state at any level; `failed` is any error reply (a request its
    child canceled included) or a broker's refusal; `expired` is the sender giving up,
    whatever became of the message. Where a request stands at the level it went to, that level says
    (`request_status`, its `command_progress`).
    """

    QUEUED = "queued"
    DISPATCHED = "dispatched"  # the broker PUBACKed it
    ACKNOWLEDGED = "acknowledged"  # the peer recorded it (message_acknowledged)
    COMPLETED = "completed"  # its reply arrived (or it needed none)
    FAILED = "failed"  # an error reply, or the broker refused it
    EXPIRED = "expired"  # no acknowledgement or answer in time: the sender gave up on it


_FINAL = frozenset({SentState.COMPLETED, SentState.FAILED, SentState.EXPIRED})


@dataclass(eq=False)
class Follower:
    """One `follow()` of a sent request (agent/followevents.py), hung on the request."""

    queue: asyncio.Queue[dict[str, Any]]
    replayed: int  # the moves of the request's history it was told before it waited


@dataclass(kw_only=True, eq=False)
class Delivery:
    """A sent message being published until acknowledged (agent/deliveries.py), hung on it."""

    payload: bytes
    props: Any  # the publish properties, built once (None: fresh per try, for an expiry)
    give_up_at: float
    patience: float = 0.0  # seconds it may go unacknowledged (its deadline's, or the default)
    resend_until: float | None  # wall clock: past it a signed message is not sent again
    delay: float
    counted: bool = False  # counted in messages_out
    timer: asyncio.TimerHandle | None = None
    answer: bool = False  # an answer: never given up while its requester is a peer (F25)
    cause: UUID | None = None  # the child whose event made it (agent/childbudget.py)
    quiet: Quiet = field(default_factory=Quiet)  # re-sends while its peer is silent


@dataclass(kw_only=True, eq=False)
class TrackedRequest:
    """One sent message and its progress."""

    message: VOXMessage
    expects_reply: bool
    state: SentState = SentState.QUEUED
    reply: VOXMessage | None = None
    error: str | None = None
    error_code: str | None = None
    history: list[tuple[SentState, float]] = field(default_factory=list)
    acknowledged: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    followers: tuple[Follower, ...] = ()  # who follows it now (a tuple: most have none)
    delivery: Delivery | None = None  # being re-sent until its peer has it
    ending: asyncio.Future[None] | None = None  # its end given up, being recorded

    @property
    def message_id(self) -> UUID:
        """Return the id of the tracked message."""
        return self.message.message_id

    @property
    def final(self) -> bool:
        """Return whether the request has reached its end (completed, failed or expired)."""
        return self.state in _FINAL


@dataclass(frozen=True, slots=True)
class SentMoved:
    """A message this agent sent moved: an event on the agent's queue (agent/requestevents.py)."""

    tracked: TrackedRequest
    old: SentState
    new: SentState
    at: float  # wall-clock time of the move: a follower is told when it happened
    step: int  # index of the move in tracked.history: a follower that replayed it skips it


@dataclass(frozen=True, slots=True)
class SentProgress:
    """The child a request went to reported on it: a follow event for its followers."""

    tracked: TrackedRequest
    event: dict[str, Any]


def _not_its_peer(request: TrackedRequest, by: UUID | None) -> bool:
    """Tell whether `by` is someone other than the agent the request was sent to.

    The pipeline refuses such a message before it gets here (agent/inbound.py); this keeps
    every other path (an ack settled while the ledger cannot record) from taking it either.
    """
    return by is not None and by != request.message.target


# How many ended requests stay in memory. They are a cache: every reader of an ended request
# falls back to the ledger, which holds how each one ended (InboundPipeline._answer_facts,
# AnswerGuard._sent_to). Kept long, each ended request (its messages, events and history,
# some 25 objects) lives into the collector's oldest generation and dies there: at 10,000
# per agent, figure 3's all-in-one run held 450,000 objects and spent 1.7-2.1 s of its 10 s
# in the collector; at 256, 130,000 objects and 1.1-1.4 s, and the CPU per command fell by
# 7-15 % (three alternating pairs; docs/performance.md, "The collector").
KEEP_FINISHED = 256


class RequestTracker:
    """Keep sent messages by id and move them through their states; each move is an event.

    `events`: the queue each move is put on (agent/requestevents.py), read by the agent's
    one reader (agent/eventreader.py); the tracker calls nobody.
    """

    def __init__(self, *, keep_finished: int = KEEP_FINISHED) -> None:
        self._requests: dict[UUID, TrackedRequest] = {}
        self._finished: deque[UUID] = deque()
        self._keep_finished = keep_finished
        # The agent's one queue of request events; it carries every owner's (requests.py,
        # RequestEvent), so it is typed there.
        self.events: EventQueue[Any] = EventQueue()

    def track(self, message: VOXMessage, *, expects_reply: bool) -> TrackedRequest:
        """Start tracking a message about to be sent."""
        request = TrackedRequest(message=message, expects_reply=expects_reply)
        request.history.append((SentState.QUEUED, time.monotonic()))
        self._requests[message.message_id] = request
        return request

    def get(self, message_id: UUID) -> TrackedRequest | None:
        """Return the tracked request with this id, if any."""
        return self._requests.get(message_id)

    def pending(self) -> list[TrackedRequest]:
        """Return the requests that are not final yet."""
        return [r for r in self._requests.values() if not r.final]

    # --- what hangs on a record: its delivery, its end being recorded, its followers ---------

    def deliver(self, request: TrackedRequest, delivery: Delivery) -> None:
        """Hang a delivery on a request: it is re-sent until its peer has it (deliveries.py)."""
        request.delivery = delivery

    def undeliver(self, request: TrackedRequest) -> Delivery | None:
        """Take a request's delivery off it: no more re-sending. Return it, if it had one."""
        delivery, request.delivery = request.delivery, None
        return delivery

    def delivering(self) -> list[TrackedRequest]:
        """Return the requests being re-sent now (an ended one's last timer may outlive it)."""
        return [r for r in self._requests.values() if r.delivery is not None]

    def recording_end(self, request: TrackedRequest) -> None:
        """The request's end is being recorded: a waiter hears of it once that is durable."""
        request.ending = asyncio.get_running_loop().create_future()

    def end_recorded(self, request: TrackedRequest) -> None:
        """The request's end is durable (or could not be recorded): its waiters go on."""
        ending, request.ending = request.ending, None
        if ending is not None and not ending.done():
            ending.set_result(None)

    def follow(self, request: TrackedRequest, follower: Follower) -> None:
        """A follower now hears the request's moves (agent/followevents.py)."""
        request.followers = (*request.followers, follower)

    def unfollow(self, request: TrackedRequest, follower: Follower) -> None:
        """A follower stopped listening."""
        request.followers = tuple(f for f in request.followers if f is not follower)

    def dispatched(self, message_id: UUID) -> None:
        """Record the broker's PUBACK."""
        request = self._requests.get(message_id)
        if request is not None and request.state is SentState.QUEUED:
            self._move(request, SentState.DISPATCHED)

    def acknowledged(self, message_id: UUID, *, by: UUID | None = None) -> TrackedRequest | None:
        """Record the peer's message_acknowledged; complete messages that need no reply.

        `by`: who acknowledged it; only the agent it was sent to may (docs/security.md, F24).
        """
        request = self._requests.get(message_id)
        if request is None or request.final or _not_its_peer(request, by):
            return request
        # An ack may overtake our own PUBACK bookkeeping: it implies dispatch.
        if request.state is not SentState.ACKNOWLEDGED:
            self._move(request, SentState.ACKNOWLEDGED)
        request.acknowledged.set()
        if not request.expects_reply:
            self._move(request, SentState.COMPLETED)
        return request

    def completed(self, message_id: UUID, reply: VOXMessage) -> TrackedRequest | None:
        """Record the reply that completes a request: only from the agent it was sent to."""
        request = self._requests.get(message_id)
        if request is None or request.final or _not_its_peer(request, reply.source):
            return request
        request.reply = reply
        request.acknowledged.set()  # a reply proves receipt even if its ack was lost
        self._move(request, SentState.COMPLETED)
        return request

    def failed(
        self, message_id: UUID, code: str, error: str, reply: VOXMessage | None = None
    ) -> None:
        """Record a failure: an error reply (which proves receipt) or a broker refusal."""
        request = self._requests.get(message_id)
        if request is None or request.final:
            return
        if reply is not None and _not_its_peer(request, reply.source):
            return
        request.error_code, request.error, request.reply = code, error, reply
        if reply is not None:
            request.acknowledged.set()
        self._move(request, SentState.FAILED)

    def published_once(self, message_id: UUID) -> None:
        """End a message published once, never re-sent nor acknowledged (an answer to a command).

        Nothing is left to wait for: its requester re-sends the request if it lacks it.
        """
        request = self._requests.get(message_id)
        if request is not None and not request.final:
            self._move(request, SentState.COMPLETED)

    def expired(self, message_id: UUID, error: str) -> None:
        """Record that the sender gave up waiting: never acknowledged or never answered in time.

        It is not marked acknowledged: whether the peer holds it is unknown, and the outbox
        takes it out in the same commit as its "expired" row.
        """
        request = self._requests.get(message_id)
        if request is None or request.final:
            return
        request.error_code, request.error = ErrorCode.TIMEOUT, error
        self._move(request, SentState.EXPIRED)

    def _move(self, request: TrackedRequest, new: SentState) -> None:
        old = request.state
        request.state = new
        request.history.append((new, time.monotonic()))
        if new in _FINAL:
            request.done.set()
            self._finished.append(request.message_id)
            if len(self._finished) > self._keep_finished:
                self._requests.pop(self._finished.popleft(), None)
        self.events.put(SentMoved(request, old, new, time.time(), len(request.history) - 1))
