"""A request's life over the wire: cancel it, ask where it stands, report and follow progress.

What carries out the lifecycle plans of agent/plan.py (a cancel, a status query, a child's
progress; their executors are agent/lifecyclesteps.py) around the pipeline's one commit of
the message, and the master's side of the same contract (`request_status`, `cancel`,
`follow`, and a handler's `progress`).
docs/messages.md ("A request's life") is the contract; docs/ledger.md what each row proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final
from uuid import UUID

from vox_mqtt.agent.cancelconfirm import reported
from vox_mqtt.agent.context import TaskSet
from vox_mqtt.agent.cuthandlers import CutHandlers
from vox_mqtt.agent.followevents import Followers
from vox_mqtt.agent.outbox import Outbox
from vox_mqtt.agent.ports import Publisher, Settings
from vox_mqtt.agent.prepared import Staged
from vox_mqtt.agent.progress import PROGRESS_INTERVAL, ProgressReporter
from vox_mqtt.agent.remembered import REMEMBERED_CANCELS, RememberedCancels
from vox_mqtt.agent.requests import Requests, Served
from vox_mqtt.agent.standing import history_of, part_of
from vox_mqtt.agent.tracking import SentProgress, SentState
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.canceling import (
    AFTER_CANCEL_WHY,
    answered_after_cancel,
    level_state,
)
from vox_mqtt.protocol.errors import CommandFailed, VoxError
from vox_mqtt.protocol.lifecycle import (
    FINAL_STATES,
    MAX_STATUS_WAIT,
    MAX_TEXT,
    MSG_CANCEL_REPORT,
    MSG_STATUS_QUERY,
    MSG_STATUS_REPORT,
    CancelReport,
    CancelRequest,
    CommandProgress,
    RequestState,
    StatusQuery,
    StatusReport,
)
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    CommandError,
    ErrorCode,
    VOXMessage,
    now_iso,
)
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.publishprops import PublishProperties

__all__ = [
    "CANCEL_GRACE",
    "MAX_STATUS_QUERIES",
    "PROGRESS_INTERVAL",
    "STATUS_WAIT",
    "Lifecycle",
]

log = logging.getLogger("vox_mqtt.agent")

# How long a cancelled handler may take to clean up before the agent says it outlived it.
CANCEL_GRACE: Final = 5.0
# How long a master waits for its child's status_report unless told otherwise.
STATUS_WAIT: Final = 5.0
# Of a status_query's wait, the share a level gives its own child: the rest is its margin.
STATUS_SHARE: Final = 0.6
# Status queries answered at once; more are answered BUSY at once (a flood stays bounded).
MAX_STATUS_QUERIES: Final = 8


class Lifecycle:
    """Cancel, status and progress of requests, served and sent, through the tree."""

    def __init__(
        self,
        *,
        settings: Settings,
        ledger: VOXAgentMemory,
        publisher: Publisher,
        props: PublishProperties,
        outbox: Outbox,
        requests: Requests,
        metrics: AgentMetrics,
        tasks: TaskSet,
    ) -> None:
        self._settings = settings
        self._ledger = ledger
        self._publisher = publisher
        self._props = props
        self._outbox = outbox
        self._requests = requests
        self._metrics = metrics
        self._tasks = tasks
        # Requests canceled before they came (agent/remembered.py).
        self._remembered = RememberedCancels()
        # Handlers a cancel cut that have not ended yet (agent/cuthandlers.py).
        self._cut = CutHandlers()
        self.reporter = ProgressReporter(
            settings=settings, publisher=publisher, props=props, metrics=metrics, requests=requests
        )
        self.followers = Followers(requests.sent)
        self._answering_status = 0
        for state, gauge in (
            (RequestState.RECEIVED, "requests_received"),
            (RequestState.WORKING, "requests_working"),
            (RequestState.DELEGATED, "requests_delegated"),
        ):
            metrics.gauge(gauge, lambda state=state: requests.count(state))  # type: ignore[misc]

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now."""
        return self._settings()

    async def load(self) -> None:
        """Read back the cancels that came before their requests (at start, docs/ledger.md).

        Each is remembered for a window from now: the restart may have come between a
        cancel and the request it raced.
        """
        self._remembered.load(await self._ledger.remembered_cancels(REMEMBERED_CANCELS))

    @property
    def remembered(self) -> int:
        """How many cancels of requests not received are remembered now."""
        return len(self._remembered)

    async def answer_unrecorded(self, message: VOXMessage) -> VOXMessage:
        """Answer a cancel beyond its sender's budget: "unknown", recorded and remembered not.

        Published once, as an answer the ledger cannot take is (docs/security.md, "Costs
        of a peer's messages"); return the report, whose ack is then not recorded either.
        """
        cancel = message.payload_as(CancelRequest)
        report = CancelReport.model_validate(
            {"request_id": cancel.request_id, "state": "unknown", "since": now_iso()}
        )
        answer = message.reply(MSG_CANCEL_REPORT, report, message_source=self.config.message_source)
        await self._outbox.publish_unrecorded(answer)
        return answer

    async def resume(self) -> None:
        """After a restart: tell the children a crash kept a cancel from (docs/ledger.md)."""
        for child, downstream in await self._ledger.untold_children():
            if UUID(child) in self.config.children:
                await self._cancel_down(UUID(child), UUID(downstream), "canceled upstream")

    # --- the facts the pipeline's plan reads -----------------------------------------------

    def cut_running(self, request_id: UUID) -> bool:
        """Tell whether a handler a cancel cut runs on: its CANCELED answer waits for it."""
        return request_id in self._cut

    def canceled_before(self, request_id: UUID) -> bool:
        """Tell whether this request's cancel came before it, within the window."""
        return request_id in self._remembered

    async def cancel_target(self, request_id: UUID) -> str:
        """Where the request a cancel names stands here (plan.Facts.target)."""
        served = self._requests.get(request_id)
        if served is not None:
            # Answered, or its answer taken: claimed, or staged already (a quick idempotent
            # one, a child's relayed: Answering.STAGED) is decided.
            decided = served.answering or served.final
            return "answering" if decided else served.state
        history = await self._history(request_id)
        state = history[-1][0] if history else "unknown"
        return "delegated" if state == "canceling" else state  # its child's answer is due

    async def _history(self, request_id: UUID) -> list[tuple[str, str]]:
        """The states a request served here went through, as (state, at), from the ledger."""
        own, _, _ = await self._ledger.request_rows(request_id)
        return [(h["state"], h["at"]) for h in history_of(own, str(self.config.id))]

    # --- one commit: what the executors stage, execute and drop (agent/lifecyclesteps.py) --

    def stage_cancel(self, message: VOXMessage) -> Staged:
        """Stage the cancel of a request in flight here: its CANCELED answer, if it can be."""
        staged = Staged()
        cancel = message.payload_as(CancelRequest)
        served = self._requests.get(cancel.request_id)
        down = None if served is None else served.down
        if served is None or served.canceling:
            pass  # its cancel passed down already: its child's answer is still due
        elif down is not None and not served.answering:
            # Delegated: the cancel passes down, no answer commits here. The child's answer,
            # relayed up as this level's (RelayAnswer), confirms it (docs/messages.md).
            self._requests.passing_cancel_down(served)
            staged.rows.append((served.request, LedgerAction.CANCELING, ErrorCode.CANCELED))
            staged.canceled, staged.canceled_down = served, down
        elif self._requests.claim_answer(served):
            name = str(served.request.details.get("command", ""))
            why = "canceled by its master" + (f": {cancel.reason}" if cancel.reason else "")
            self._stage_answer(staged, served.request, name, why)
            staged.canceled = served
            staged.canceled_down = served.down
        return staged

    def _stage_answer(self, staged: Staged, request: VOXMessage, name: str, why: str) -> None:
        # The CANCELED answer and the request's "canceled" row commit with the message that
        # cancels it: after that commit, a restart neither runs nor resumes it.
        error = CommandError(code=ErrorCode.CANCELED, error=why, command=name or None)
        try:
            outgoing = self._outbox.prepare(
                request.reply(MSG_COMMAND_ERROR, error), answering=request
            )
        except VoxError:
            outgoing = None  # no longer a peer (the fleet changed): recorded, not answered
        staged.outgoing = outgoing
        if outgoing is not None:
            staged.rows.append((outgoing.message, LedgerAction.SENT, None))
        staged.rows.append((request, LedgerAction.CANCELED, ErrorCode.CANCELED))

    def unstage_cancel(self, staged: Staged) -> None:
        """Undo a staged cancel whose commit failed: the request goes on as if never canceled."""
        if staged.canceled is not None and staged.canceled.canceling:
            # Not passed down: its child was never told.
            self._requests.passing_cancel_down(staged.canceled, False)
        elif staged.canceled is not None:
            self._requests.release_answer(staged.canceled)

    def remember(self, message: VOXMessage) -> None:
        """From now: the request a cancel names, if it comes while this commits, never starts."""
        self._remembered.remember(message.payload_as(CancelRequest).request_id)

    def forget(self, message: VOXMessage) -> None:
        """A remembered cancel whose commit failed: forgotten."""
        self._remembered.drop(message.payload_as(CancelRequest).request_id)

    def cancel_in_task(
        self, message: VOXMessage, staged: Staged, *, unknown: bool, wait: bool
    ) -> None:
        """Carry out a committed cancel and report, in a task (unknown: not received here;
        wait: its answer is being sent, and the report waits for its end)."""
        self._metrics.cancels_received += 1
        self._tasks.spawn(self._cancel(message, staged, unknown=unknown, wait=wait), "cancel")

    def status(self, message: VOXMessage) -> None:
        """Answer a committed status_query, in a task (BUSY beyond MAX_STATUS_QUERIES)."""
        self._metrics.status_queries += 1
        if self._answering_status >= MAX_STATUS_QUERIES:
            busy = f"{self.config.name} answers {MAX_STATUS_QUERIES} status queries at once"
            self._tasks.spawn(self._reply(message, _busy(busy)), "status-busy")
        else:
            self._answering_status += 1
            self._tasks.spawn(self._answer_status(message), "status")

    def progress(self, message: VOXMessage) -> None:
        """Take a child's committed command_progress (passed up, told to followers)."""
        self._progress_in(message)

    # --- cancel, at the agent that serves the request --------------------------------------

    async def _cancel(
        self, message: VOXMessage, staged: Staged, *, unknown: bool, wait: bool
    ) -> None:
        try:
            await self._cancel_and_report(message, staged, unknown=unknown, wait=wait)
        except VoxError as exc:  # the ledger could not be read: the master hears why
            await self._reply(message, _unavailable(exc))

    async def _cancel_and_report(
        self, message: VOXMessage, staged: Staged, *, unknown: bool, wait: bool
    ) -> None:
        cancel = message.payload_as(CancelRequest)
        request_id = cancel.request_id
        served, down = staged.canceled, staged.canceled_down
        state, since, why = "unknown", now_iso(), None
        held = self._requests.get(request_id) if served is None else served
        if held is not None and held.canceling:
            # Passed down (now or by an earlier cancel): canceling until its child's answer
            # comes up, which its own task relays as this level's answer (docs/messages.md).
            if served is not None and down is not None:
                await self._cancel_down(*down, cancel.reason)
            state, served = "canceling", None
        elif served is not None:
            await self._stop(served, down, cancel.reason)
            if (answer := staged.outgoing) is not None:
                # Its CANCELED answer, recorded with the cancel, leaves once its cut handler
                # ended: never while the handler still runs (docs/messages.md).
                self._cut.then(served.message_id, lambda: self._outbox.dispatch(answer))
        elif unknown:
            # Remembered since its stage; the request may have come while the cancel
            # committed (another intake worker): it is stopped now, never left to run.
            served = await self._arrived_meanwhile(request_id)
            if served is not None:
                down = served.down
                await self._stop(served, down, cancel.reason)
        else:
            state, since, why = await self._final_state(request_id, wait=wait)
            if state == "canceled":
                # Canceled before: its child is not asked here (a frozen one would hold the
                # report); with a child, or a cut handler not ended, it is `canceling`, and
                # the master's status rounds tell when it is confirmed (docs/messages.md).
                _, sent_down, _ = await self._ledger.request_rows(request_id)
                below = "unknown" if sent_down else None
                state, _ = level_state(state, below=below, handler_running=request_id in self._cut)
        if served is not None:
            # "canceled" only once nothing of it can run any more (docs/messages.md): its
            # handler ended, and no child holds it; a child's confirmation comes later, and
            # `request_status` tells it (protocol/canceling.py).
            ended = await self._handler_ended(served)
            below = None if down is None else "unknown"  # the child has not confirmed yet
            state, _ = level_state("canceled", below=below, handler_running=not ended)
        report = CancelReport.model_validate(
            {"request_id": request_id, "state": state, "since": since, "why": why}
        )
        await self._reply(message, (MSG_CANCEL_REPORT, report))

    async def _stop(
        self, served: Served, down: tuple[UUID, UUID] | None, reason: str | None
    ) -> None:
        """Stop a request whose "canceled" row committed: its task, its child's part."""
        task, early = served.task, served.early
        self._requests.move(served, RequestState.CANCELED)
        if early is not None:
            early.cancel()
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # a queued one never starts; a running handler sees it now
        else:
            task = None
        # Until they end, the request is `canceling` here (protocol/canceling.py).
        self._cut.watch(served.message_id, (task, early))
        if down is not None:
            await self._cancel_down(*down, reason)

    async def _handler_ended(self, served: Served) -> bool:
        """Wait, bounded, for a cut handler to end; False: it outlived its cancel."""
        if await self._cut.ended(served.message_id, CANCEL_GRACE):
            return True
        # Its slot stays taken until the handler ends; the report says `canceling`.
        name = served.request.details.get("command")
        log.warning("%s: %s outlived its cancel by %.0fs", self.config.name, name, CANCEL_GRACE)
        return False

    async def _arrived_meanwhile(self, request_id: UUID) -> Served | None:
        """A request that came while its cancel committed: answered CANCELED, or None."""
        served = self._requests.get(request_id)
        if served is None or not self._requests.claim_answer(served):
            return None
        # Its own record first, so its "canceled" row follows its "received" one.
        recorded = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_GRACE):
                recorded = await asyncio.shield(served.recorded)
        if not recorded:
            # Its commit failed or stalls: let its own path go on (a failed one is dropped,
            # and a re-delivery meets the remembered cancel); never leave it claimed.
            self._requests.release_answer(served)
            log.warning(
                "%s: %s did not commit within %.0fs of its cancel; the cancel stays remembered",
                self.config.name,
                request_id,
                CANCEL_GRACE,
            )
            return None
        name = str(served.request.details.get("command", ""))
        error = CommandError(code=ErrorCode.CANCELED, error="canceled by its master", command=name)
        with contextlib.suppress(VoxError):
            await self._outbox.send_message(
                served.request.reply(MSG_COMMAND_ERROR, error),
                expects_reply=False,
                then=[(served.request, LedgerAction.CANCELED, ErrorCode.CANCELED)],
                answering=served.request,
            )
        return served

    async def _final_state(self, request_id: UUID, *, wait: bool) -> tuple[str, str, str | None]:
        """The state a request ended in here (waiting, bounded, for one being answered), and
        AFTER_CANCEL_WHY for an end that came up from below after its cancel passed down."""
        served = self._requests.get(request_id)
        if wait and served is not None and served.task:
            await asyncio.wait({served.task}, timeout=CANCEL_GRACE)  # it sends its answer
        history = await self._history(request_id)
        ended = [(s, at) for s, at in history if s in FINAL_STATES]
        if ended:  # after a `canceling` row, and not `canceled`: it came up after the cancel
            after = ended[-1][0] != "canceled" and any(s == "canceling" for s, _ in history)
            return *ended[-1], AFTER_CANCEL_WHY if after else None
        if served is not None:
            end = served.state if served.final else served.answer_end
            if end is not None:  # answered, its end row still on its way to the ledger
                return end, now_iso(), None
        last = history[-1] if history and history[-1][0] == "canceling" else None
        return (*last, None) if last else ("unknown", now_iso(), None)

    async def _cancel_down(self, child: UUID, downstream: UUID, reason: str | None) -> None:
        """Tell a child to cancel the request sent to it (durable: re-sent until acknowledged)."""
        with contextlib.suppress(VoxError):
            await self._outbox.send_cancel(child, downstream, reason)

    async def _reply(self, message: VOXMessage, answer: tuple[str, Any]) -> None:
        with contextlib.suppress(VoxError):
            await self._outbox.reply(message, *answer)

    # --- status, at the agent that serves the request --------------------------------------

    async def _answer_status(self, query: VOXMessage) -> None:
        try:
            asked = query.payload_as(StatusQuery)
            within = STATUS_WAIT if asked.within is None else asked.within
            part = await self._part(asked.request_id, within * STATUS_SHARE)
            report = StatusReport(request_id=asked.request_id, **part)
            await self._reply(query, (MSG_STATUS_REPORT, report))
        except VoxError as exc:  # the ledger could not be read: the master hears why
            await self._reply(query, _unavailable(exc))
        finally:
            self._answering_status -= 1

    async def _part(self, request_id: UUID, wait: float) -> dict[str, Any]:
        """This level's part of a status report, from its ledger; its child's part below."""
        own, down, cancels = await self._ledger.request_rows(request_id)
        part = part_of(own, cancels, str(self.config.id))
        below: str | None = None
        if down and part["state"] != "unknown":
            # The child is named only to ask it; nothing of it goes into the report.
            last = down[-1]
            part["below"] = await self._ask_child(
                UUID(last["target"]), UUID(last["message_id"]), wait
            )
            below = str(part["below"].get("state"))
        # Canceled here, and still able to run here or below: `canceling` (docs/messages.md).
        state, why = level_state(
            part["state"], below=below, handler_running=request_id in self._cut
        )
        part["state"] = state
        if why is not None:
            part["why"] = why
        elif answered_after_cancel(part):
            part["why"] = AFTER_CANCEL_WHY  # its end came up from below after its cancel
        return part

    async def _ask_child(self, child: UUID, request_id: UUID, wait: float) -> dict[str, Any]:
        """Ask a child where a request sent to it stands: its part, or why there is none."""
        try:
            report = await self._query(child, request_id, wait)
        except (CommandFailed, VoxError) as exc:
            why = exc.error if isinstance(exc, CommandFailed) else str(exc)
            return {"state": "unreachable", "why": why[:MAX_TEXT]}
        return report.model_dump(mode="json", exclude_none=True, exclude={"request_id"})

    async def _query(self, child: UUID, request_id: UUID, wait: float) -> StatusReport:
        """Send a status_query and return its report (CommandFailed: none in time)."""
        query = StatusQuery(request_id=request_id, within=min(wait, MAX_STATUS_WAIT))
        message = self._outbox.addressed(MSG_STATUS_QUERY, query, child)
        # Recorded, never kept in the outbox: a query nobody awaits after a restart is moot.
        outgoing = self._outbox.prepare(message, expects_reply=True)
        started = time.perf_counter()
        await self._ledger.record_message(message, LedgerAction.SENT)
        tracked = self._outbox.dispatch(outgoing)
        reply = await self._outbox.reply_to(tracked, wait, started=started)
        if reply.type != MSG_STATUS_REPORT:
            raise CommandFailed(ErrorCode.INVALID_MESSAGE, f"answered {reply.type}")
        return reply.payload_as(StatusReport)

    # --- progress ---------------------------------------------------------------------------

    def _progress_in(self, message: VOXMessage) -> None:
        """A child's progress: passed up for a request delegated from here, told to followers."""
        sent = None if message.reply_to is None else self._requests.sent.get(message.reply_to)
        if sent is None or sent.message.target != message.source:
            # Recorded, nothing more: only the child a request went to reports on it.
            log.info(
                "%s: progress from %s on a request not sent to it", self.config.name, message.source
            )
            return
        progress = message.payload_as(CommandProgress)
        served = self._requests.relaying(sent.message_id)
        if served is not None:
            # Its part one level down; nothing names the child (extra fields were dropped).
            below = progress.model_dump(mode="json", exclude_none=True)
            self.reporter.emit(served, {"state": "delegated", "below": below})
        details = progress.model_dump(mode="json", exclude_none=True, exclude={"seq"})
        # A bare state is a transition (working, delegated); anything more is progress.
        state = progress.state if details.keys() == {"state"} else "progress"
        told = {"state": state, "at": now_iso(), "details": details}
        # On the queue of request events, so its followers hear it after the moves before it.
        self._requests.events.put(SentProgress(sent, told))

    # --- the master's side: status, cancel and follow of a request it sent -------------------

    async def request_status(
        self, request_id: UUID, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Ask the child a request was sent to where it stands; return the nested report.

        Each level answers for its own part from its ledger and nests its child's part in
        `below`, naming no agent (docs/messages.md). Raises VoxError for a request this
        agent did not send, CommandFailed when the child does not answer in time.
        """
        child = await self._sent_to(request_id)
        wait = STATUS_WAIT if timeout is None else timeout
        report = await self._query(child, request_id, min(wait, MAX_STATUS_WAIT))
        return report.model_dump(mode="json", exclude_none=True)

    async def cancel(
        self, request_id: UUID, *, reason: str | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Cancel a request this agent sent; return what the cancel has done.

        The child's cancel_report details, whose `state` is `canceled` only once every level
        that held the request confirmed it cannot run there (docs/messages.md, "A request's
        life"): a report of `canceled` or `canceling` is checked by status queries until
        every level confirmed or `timeout` is spent. Added (protocol/canceling.py): `line`
        (one line for people), `level` (the first level, 1 = the child, that has not
        confirmed, or where it ended anyway) and `levels` (the last nested status report).
        The cancel_request is durable: kept in the outbox and re-sent until the child
        acknowledges it, so a child that is away gets it when it is back. CommandFailed
        (TIMEOUT) when no report came in time: the cancel itself still stands.
        """
        child = await self._sent_to(request_id)
        tracked = await self._outbox.send_cancel(
            child, request_id, reason and reason[:MAX_TEXT], expects_reply=True
        )
        limit = self.config.request_timeout if timeout is None else timeout
        ends = time.monotonic() + limit
        try:
            async with asyncio.timeout(limit):
                await tracked.done.wait()
        except TimeoutError:
            raise CommandFailed(
                ErrorCode.TIMEOUT,
                f"no cancel_report within {limit:.1f}s; the cancel stays in the outbox"
                " and reaches the child when it is back",
            ) from None
        reply = tracked.reply
        if tracked.state is not SentState.COMPLETED or reply is None:
            raise CommandFailed(tracked.error_code or ErrorCode.TIMEOUT, tracked.error or "failed")

        async def ask(within: float) -> dict[str, Any]:
            part = await self._query(child, request_id, within)
            return part.model_dump(mode="json", exclude_none=True, exclude={"request_id"})

        report = reply.payload_as(CancelReport).model_dump(mode="json", exclude_none=True)
        name = self.config.children.get(child, str(child))
        return await reported(report, ask, name, ends, most=STATUS_WAIT)

    async def _sent_to(self, request_id: UUID) -> UUID:
        """The child this agent sent a request to (its tracker, else its ledger).

        An agent with one child (the operator's, whose child is the root) asks that child
        about any id: the child answers "unknown" for one it never received.
        """
        tracked = self._requests.sent.get(request_id)
        if tracked is not None:
            return tracked.message.target
        me = str(self.config.id)
        for row in await self._ledger.find(request_id):
            if row["action"] == LedgerAction.SENT and row["source"] == me and row["target"]:
                return UUID(row["target"])
        children = list(self.config.children)
        if len(children) == 1:
            return children[0]
        raise VoxError(f"{request_id} is not a request {self.config.name} sent")

    async def follow(self, request_id: UUID) -> AsyncIterator[dict[str, Any]]:
        """Yield each transition of a request this agent sent, as it happens, to its end.

        {"state": sent|acknowledged|working|delegated|progress|completed|failed|canceled|
        expired, "at": ISO time, "details": {...}}; what happened before the call comes first.
        """
        tracked = self._requests.sent.get(request_id)
        if tracked is None:
            raise VoxError(f"{request_id} is not a request {self.config.name} follows")
        async for event in self.followers.follow(tracked):
            yield event


def _busy(why: str) -> tuple[str, CommandError]:
    return MSG_COMMAND_ERROR, CommandError(code=ErrorCode.BUSY, error=why)


def _unavailable(exc: VoxError) -> tuple[str, CommandError]:
    return MSG_COMMAND_ERROR, CommandError(code=ErrorCode.LEDGER_UNAVAILABLE, error=str(exc))
