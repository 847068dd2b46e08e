"""The freelance-work application of contract v1 (seed 003): the roles the seed fleet mounts.

- MailWatcher (specialist): turns e-mail files dropped in an intake folder into job_detected.
- Analyst (specialist): the `analyze` command of seed 000's delegation flow.
- Coordinator: checks each job against its allotted work time (the approved jobs take) and
  notifies the root, naming the undecided jobs it overlaps; records the human's decisions;
  answers the root's data_request for a financial_summary.
- Root: notifies the operator of jobs, relays the operator's decisions to the coordinator
  that notified each job; `financial_summary` asks the coordinators.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError

from vox_mqtt.agent.roles import AgentHandle, Role, command, on
from vox_mqtt.protocol.domain import (
    MSG_DATA_REQUEST,
    MSG_DATA_RESPONSE,
    MSG_DECISION,
    MSG_DECISION_RECORDED,
    MSG_JOB_DETECTED,
    DataRequest,
    DataResponse,
    Decision,
    Price,
)
from vox_mqtt.protocol.errors import CommandFailed, InvalidParams
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    CommandError,
    ErrorCode,
    IsoTimestamp,
    VOXMessage,
    now_iso,
    parse_timestamp,
)

from ._settings import positive_seconds
from .decisions import (
    OVERLAPS,
    UNKNOWN_JOB,
    Refusal,
    judge,
    notified_as,
    overlapping,
    translate_overlaps,
)
from .jobbook import APPROVE, BookedJob, JobBook
from .mailwatcher import MailWatcher
from .schedule import Booking, WeeklySchedule

__all__ = ["FINANCIAL_SUMMARY", "Analyst", "Coordinator", "MailWatcher", "Root", "analyze_text"]

log = logging.getLogger("examples.freelance")

FINANCIAL_SUMMARY: Final = "financial_summary"


# --- specialists ------------------------------------------------------------------------------


def analyze_text(target: str) -> dict[str, Any]:
    """Return a small, deterministic analysis of a string: size, kind and digest."""
    if re.fullmatch(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}", target):
        kind = "e-mail address"
    elif re.match(r"[a-z][a-z0-9+.-]*://", target):
        kind = "url"
    elif (suffix := Path(target).suffix) and re.fullmatch(r"\.[A-Za-z0-9]{1,8}", suffix):
        kind = f"file name ({suffix.lower()})"
    else:
        kind = "text"
    return {
        "target": target[:200],
        "kind": kind,
        "characters": len(target),
        "words": len(target.split()),
        "sha256": hashlib.sha256(target.encode("utf-8", "surrogatepass")).hexdigest()[:16],
    }


class Analyst(Role):
    """A specialist's `analyze` command: the task of seed 000's delegation flow."""

    # Pure: running it twice gives the same answer and changes nothing, so its handler may
    # start while its record commits (docs/ledger.md, rows that commit together).
    @command(idempotent=True)
    async def analyze(self, target: str) -> dict[str, Any]:
        """Analyze a target string; the answer names no specialist: the root never learns who."""
        return analyze_text(target)


# --- coordinator ------------------------------------------------------------------------------


class _JobFacts(BaseModel):
    """The fields of a job_detected the coordinator may read: never note_to_human."""

    # extra="ignore": note_to_human and any other free text are not even copied in here.
    model_config = ConfigDict(extra="ignore", frozen=True)

    start_time: str
    end_time: str
    estimated_effort_minutes: int
    price: Price


class Coordinator(Role):
    """Check each job_detected against the allotted work time and notify the root if it fits.

    Only approved jobs take time: an undecided job never keeps a later one from being
    notified, and each notification names the undecided jobs it overlaps. It records the
    human's decisions and decides nothing, changes no job and contacts no client. Settings:
    timezone (IANA, default UTC), work_week (e.g. {mon = ["09:00-17:00"], ...}, default
    Monday to Friday 09:00-17:00), currency (of financial summaries, default USD).
    """

    def __init__(self, *, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings=settings)
        self.schedule = WeeklySchedule.from_settings(self.settings)
        currency = self.settings.get("currency", "USD")
        if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
            raise ValueError(f"setting currency must be an ISO-4217 code, not {currency!r}")
        self.currency = currency
        self._book: JobBook | None = None
        self._lock = asyncio.Lock()

    @property
    def book(self) -> JobBook:
        """Return the jobs already notified (loaded from the state dir at start)."""
        if self._book is None:
            self._book = JobBook(Path(self.agent.config.state_dir) / "jobs.json")
            self._book.load()
        return self._book

    @property
    def reports_dir(self) -> Path:
        """Return the folder of generated reports."""
        return Path(self.agent.config.state_dir) / "reports"

    async def start(self) -> None:
        """Load the job book, so a damaged file stops the agent at once."""
        _ = self.book

    @on(MSG_JOB_DETECTED)
    async def job_detected(self, message: VOXMessage) -> None:
        """Notify the root of a job that fits the allotted time (the runtime acknowledged it)."""
        if message.source not in self.agent.config.children:
            log.warning("%s: job_detected %s not from a child", self.agent.name, message.message_id)
            return
        facts = _JobFacts.model_validate(message.details)
        start, end = parse_timestamp(facts.start_time), parse_timestamp(facts.end_time)
        job = Booking(start=start, end=end, effort_minutes=facts.estimated_effort_minutes)
        async with self._lock:  # check and book as one step: two jobs cannot take one slot
            if message.message_id in self.book:
                return
            # Only what the human approved takes time (docs: examples/README.md, decisions).
            fit = self.schedule.fit(job, self.book.bookings())
            if not fit.fits:
                await self._record(message, "not_notified", reason=f"does not fit: {fit.reason}")
                log.info(
                    "%s: job %s does not fit the allotted time (%s); not notified",
                    self.agent.name,
                    message.message_id,
                    fit.reason,
                )
                return
            overlaps = overlapping(job, self.book.undecided())
            # The details go up unchanged but for the overlaps: note_to_human is opaque here,
            # for the human only, so it is passed through without being read, logged or
            # stored (seed 003).
            tracked = await self.agent.notify_master(
                MSG_JOB_DETECTED,
                {**message.details, OVERLAPS: overlaps},
                message_source=message.message_source,
            )
            booked = BookedJob(
                message_id=str(message.message_id),
                forwarded_as=str(tracked.message_id),
                start_time=facts.start_time,
                end_time=facts.end_time,
                estimated_effort_minutes=facts.estimated_effort_minutes,
                currency=facts.price.currency,
                value=facts.price.value,
                notified_at=now_iso(),
            )
            await asyncio.to_thread(self.book.add, booked)
        await self._record(message, "notified", forwarded_as=str(tracked.message_id))
        log.info(
            "%s: job %s fits (%s); notified %s as %s, overlapping %d undecided job(s)",
            self.agent.name,
            message.message_id,
            fit.reason,
            self.agent.config.master_name,
            tracked.message_id,
            len(overlaps),
        )

    @on(MSG_DECISION)
    async def decision(self, message: VOXMessage) -> None:
        """Record the human's verdict on a notified job; answer what it changed, or why not."""
        if message.source != self.agent.config.master_id:
            reason = "a decision comes from the master alone"
            await refuse_decision(self.agent, message, ErrorCode.UNAUTHORIZED_SOURCE, reason)
            return
        decision = message.payload_as(Decision)
        job_id = str(decision.in_response_to)
        async with self._lock:  # one verdict per job, against the approvals of that moment
            job = self.book.notified_as(job_id)
            approved = [
                j.booking()
                for j in self.book.jobs()
                if j.decision == APPROVE and (job is None or j.message_id != job.message_id)
            ]
            judged = judge(
                decision.verdict,
                job,
                job_id=job_id,
                approved=approved,
                schedule=self.schedule,
                now=datetime.now(UTC),
            )
            if isinstance(judged, Refusal):
                await refuse_decision(self.agent, message, judged.code, judged.reason)
                return
            assert job is not None  # judge refuses a decision on an unknown job
            await asyncio.to_thread(self.book.decide, job.message_id, decision.verdict, now_iso())
        # The decision's own id is the row's: `vox ledger trace` shows it beside the job.
        await self.agent.memory.record(
            "job",
            "approved" if decision.verdict == APPROVE else "rejected",
            message.source,
            self.agent.id,
            {"message_id": str(message.message_id), "in_response_to": job_id,
             "outcome": judged.outcome},
        )  # fmt: skip
        answer = Decision(
            in_response_to=decision.in_response_to,
            verdict=decision.verdict,
            outcome=judged.outcome,
        )
        await self.agent.reply(message, MSG_DECISION_RECORDED, answer)
        log.info("%s: job %s %s", self.agent.name, job_id, judged.outcome)

    async def _record(self, message: VOXMessage, action: str, **details: str) -> None:
        # Message-first: the ledger row names the message, never the job's business details.
        await self.agent.memory.record(
            "job",
            action,
            message.source,
            self.agent.id,
            {"in_response_to": str(message.message_id), **details},
        )

    @on(MSG_DATA_REQUEST)
    async def data_request(self, message: VOXMessage) -> None:
        """Answer the root's data_request financial_summary with a data_response."""
        if message.source != self.agent.config.master_id:
            log.warning("%s: data_request %s not from the master", self.agent.name, message.source)
            return
        request = DataRequest.model_validate(message.details)
        if request.subject != FINANCIAL_SUMMARY:
            await self._refuse(message, ErrorCode.NO_ROUTE, f"no data for {request.subject!r}")
            return
        dates = [request.parameters.get(key) for key in ("start_date", "end_date")]
        if not all(isinstance(value, str) for value in dates):
            reason = "financial_summary needs parameters start_date and end_date"
            await self._refuse(message, ErrorCode.INVALID_PARAMS, reason)
            return
        start, end = (parse_timestamp(str(value)) for value in dates)
        summary = await asyncio.to_thread(
            self.book.summary,
            start,
            end,
            currency=self.currency,
            request_id=message.message_id,
            reports=self.reports_dir,
        )
        response = DataResponse(
            request_id=message.message_id,
            total=Price(currency=summary.currency, value=summary.total),
            attachments=[str(summary.csv_path)],
            jobs=summary.jobs,
            other_currencies=summary.other_currencies,
        )
        await self.agent.reply(message, MSG_DATA_RESPONSE, response)
        log.info(
            "%s: financial_summary %s..%s: %d job(s), %d %s, %s",
            self.agent.name,
            dates[0],
            dates[1],
            summary.jobs,
            summary.total,
            summary.currency,
            summary.csv_path,
        )

    async def _refuse(self, message: VOXMessage, code: str, reason: str) -> None:
        log.warning("%s: data_request %s refused: %s", self.agent.name, message.message_id, reason)
        await self.agent.reply(message, MSG_COMMAND_ERROR, CommandError(code=code, error=reason))


# --- root -------------------------------------------------------------------------------------


class Root(Role):
    """Notify the operator of jobs; serve the operator's `financial_summary` command.

    Settings: ask_timeout (seconds to wait for each coordinator's data_response,
    default 10).
    """

    def __init__(self, *, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings=settings)
        self.ask_timeout = positive_seconds(self.settings, "ask_timeout", 10.0)

    @on(MSG_JOB_DETECTED)
    async def job_detected(self, message: VOXMessage) -> None:
        """Pass a coordinator's job to the operator, whose inbox shows it to the human."""
        master = self.agent.config.master_id
        if message.source not in self.agent.config.children or master is None:
            log.warning("%s: job_detected %s not from a child", self.agent.name, message.message_id)
            return
        details = dict(message.details)
        if OVERLAPS in details:  # the overlapping jobs, by the ids the operator knows them as
            details[OVERLAPS] = translate_overlaps(details[OVERLAPS], self.agent.id)
        forwarded = notified_as(self.agent.id, message.message_id)
        # The row that ties the notification to the job it passes up, before it is sent: a
        # decision on it goes to the child that notified the job, and its reply_to makes
        # `vox ledger trace` show the job, its notification and the decision as one chain.
        await self.agent.memory.record(
            "job",
            "notified",
            message.source,
            master,
            {"message_id": str(forwarded), "reply_to": str(message.message_id)},
        )
        notice = VOXMessage(
            message_id=forwarded,
            message_source=message.message_source,
            emitted_at=now_iso(),
            source=self.agent.id,
            target=master,
            type=MSG_JOB_DETECTED,
            details=details,
        )
        await self.agent.send_message(notice, expects_reply=False)
        log.info(
            "%s: job %s from %s notified to the operator as %s",
            self.agent.name,
            message.message_id,
            self.agent.config.children[message.source],
            forwarded,
        )

    @on(MSG_DECISION)
    async def decision(self, message: VOXMessage) -> None:
        """Relay the operator's decision to the child that notified the job; answer back."""
        if message.source != self.agent.config.master_id:
            reason = "a decision comes from the operator alone"
            await refuse_decision(self.agent, message, ErrorCode.UNAUTHORIZED_SOURCE, reason)
            return
        decision = message.payload_as(Decision)
        link = await self._notified(decision.in_response_to)
        if link is None:
            reason = f"no job was notified as {decision.in_response_to}"
            await refuse_decision(self.agent, message, UNKNOWN_JOB, reason)
            return
        child, received = link
        # The root relays and decides nothing: the coordinator records the verdict.
        relayed = Decision(in_response_to=received, verdict=decision.verdict, note=decision.note)
        try:
            answer = await self.agent.ask(
                MSG_DECISION, relayed, to=child, timeout=self.ask_timeout, reply_to=received
            )
        except CommandFailed as exc:
            await refuse_decision(self.agent, message, exc.code, exc.error)
            return
        # Validated as its type on arrival: a decision_recorded's payload is a Decision.
        recorded = answer.type == MSG_DECISION_RECORDED
        outcome = answer.payload_as(Decision).outcome if recorded else None
        if outcome is None:
            reason = f"{self.agent.config.children[child]} answered the decision with no outcome"
            await refuse_decision(self.agent, message, ErrorCode.HANDLER_ERROR, reason)
            return
        await self.agent.reply(
            message,
            MSG_DECISION_RECORDED,
            Decision(
                in_response_to=decision.in_response_to, verdict=decision.verdict, outcome=outcome
            ),
        )
        log.info(
            "%s: decision %s on job %s relayed to %s: %s",
            self.agent.name,
            message.message_id,
            decision.in_response_to,
            self.agent.config.children.get(child, child),
            outcome,
        )

    async def _notified(self, forwarded: UUID) -> tuple[UUID, UUID] | None:
        """Return (child, job as received) of a notification this root sent, from its ledger."""
        for row in await self.agent.memory.find(forwarded):
            if (row["event_type"], row["action"]) != ("job", "notified"):
                continue
            child, received = UUID(row["source"]), UUID(row["reply_to"])
            if child in self.agent.config.children:
                return child, received
        return None

    @command
    async def financial_summary(
        self, start_date: IsoTimestamp, end_date: IsoTimestamp
    ) -> dict[str, Any]:
        """Ask every coordinator for the total of approved jobs between two dates.

        Each date is an ISO-8601 time with its timezone: one without is refused before this
        runs (INVALID_PARAMS, docs/messages.md), as is an end before the start below.
        """
        try:
            request = DataRequest(
                subject=FINANCIAL_SUMMARY,
                parameters={"start_date": start_date, "end_date": end_date},
            )
        except ValidationError as exc:
            reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            reason = reason.replace("parameters.", "")  # the operator named them without it
            # The operator's dates, wrong together: theirs to fix, not a fault here.
            raise InvalidParams(reason) from None
        children = dict(self.agent.config.children)
        answers = await asyncio.gather(
            *(self._ask(child, request) for child in children), return_exceptions=True
        )
        totals: dict[str, int] = {}
        attachments: list[str] = []
        answered, failed = [], {}
        jobs = 0
        for name, answer in zip(children.values(), answers, strict=True):
            if isinstance(answer, BaseException):
                failed[name] = str(answer)
                continue
            answered.append(name)
            response = DataResponse.model_validate(answer.details)
            attachments += response.attachments
            if response.total is not None:
                totals[response.total.currency] = (
                    totals.get(response.total.currency, 0) + response.total.value
                )
            with contextlib.suppress(TypeError, ValueError):
                jobs += int((response.model_extra or {}).get("jobs", 0))
        if not answered:
            raise RuntimeError(
                "no coordinator answered: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
            )
        currency = next(iter(totals), "USD")
        return {
            "start_date": start_date,
            "end_date": end_date,
            "total": {"currency": currency, "value": totals.get(currency, 0)},
            "other_totals": {k: v for k, v in totals.items() if k != currency},
            "jobs": jobs,
            "attachments": attachments,
            "answered_by": answered,
            "unanswered": failed,
        }

    async def _ask(self, child: UUID, request: DataRequest) -> VOXMessage:
        try:
            return await self.agent.ask(
                MSG_DATA_REQUEST, request, to=child, timeout=self.ask_timeout
            )
        except CommandFailed as exc:
            raise RuntimeError(f"{exc.code}: {exc.error}") from None


async def refuse_decision(agent: AgentHandle, message: VOXMessage, code: str, reason: str) -> None:
    """Refuse a decision: a rejected row under its id, and a command_error saying why."""
    reason = " ".join(reason.split())[:1000]
    log.warning("%s: decision %s refused: %s: %s", agent.name, message.message_id, code, reason)
    await agent.memory.record(
        "decision",
        "rejected",
        message.source,
        agent.id,
        {"message_id": str(message.message_id), "code": code, "reason": reason},
    )
    await agent.reply(message, MSG_COMMAND_ERROR, CommandError(code=code, error=reason))
