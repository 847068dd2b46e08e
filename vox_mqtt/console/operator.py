"""The operator's client: the root's master, for sending commands and watching the fleet."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.console.decisions import Job, number_jobs
from vox_mqtt.console.web_operator import note_of
from vox_mqtt.fleet.config import ConsoleFile, load_console_config
from vox_mqtt.ledger.peernames import write_names
from vox_mqtt.ledger.privatefs import private_dir
from vox_mqtt.observe.status import FleetView
from vox_mqtt.protocol.domain import MSG_DECISION, Decision
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_REQUEST,
    CommandRequest,
    VOXMessage,
    new_message,
    now_iso,
)
from vox_mqtt.protocol.signing import is_sealed
from vox_mqtt.protocol.topics import PRESENCE_FILTER, STATUS_FILTER, WARROOM_FILTER

__all__ = ["ALL_STATUS", "OperatorConsole", "Sent"]

ALL_STATUS = STATUS_FILTER  # the filter of every agent's status, under its old name
_NOT_NOTIFICATIONS = frozenset({MSG_ACKNOWLEDGED, MSG_COMMAND_REQUEST})


class OperatorConsole:
    """Connect as the operator for one `async with` block."""

    def __init__(
        self,
        config: ConsoleFile | str | Path,
        *,
        base: Path | None = None,
        persistent: bool = True,
        observe: Sequence[str] = (),
    ) -> None:
        if not isinstance(config, ConsoleFile):
            path = Path(config)
            base = path.parent if base is None else base
            config = load_console_config(path)
        self.file = config
        base = base or Path.cwd()
        # Only the persistent session uses the operator's own client id: a second,
        # read-only console (status, watch) must not take that session over. A broker that
        # locks client ids to usernames would make it the operator's own: refused there
        # (ConfigError), `vox status` and `vox watch` log in as looks of their own.
        op = config.operator
        client_id = str(op.id) if persistent else f"{op.id}-{secrets.token_hex(4)}"
        agent_config = config.agent_config(base, client_id=client_id, observe=observe)
        self.inbox_path = agent_config.state_dir / "inbox.jsonl"
        self.decisions_path = agent_config.state_dir / "decisions.jsonl"
        self.agent = VOXAgent(agent_config)
        self.agent.listeners.append(self._keep_notification)

    @property
    def root_id(self) -> Any:
        """Return the root agent's id."""
        return self.file.operator.root_id

    @property
    def view(self) -> FleetView:
        """Return the liveness of every agent this console has seen."""
        return self.agent.fleet_view

    async def __aenter__(self) -> OperatorConsole:
        state_dir = self.inbox_path.parent
        if state_dir.exists() and not state_dir.is_dir():
            raise ConfigError(
                [f"state dir {state_dir}: it is a file, not a folder — move the file away or "
                 "point operator.state_dir elsewhere"]
            )  # fmt: skip
        await self.agent.__aenter__()
        op = self.file.operator
        write_names(state_dir, {op.id: op.name, op.root_id: op.root_name})
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.agent.__aexit__(exc_type, exc, tb)

    async def send_command(
        self, command: str, params: dict[str, Any] | None = None, *, wait: float | None = None
    ) -> VOXMessage:
        """Send a command_request to the root and return the command_result."""
        return await self.agent.request(command, params, to=self.root_id, timeout=wait)

    async def start_command(
        self, command: str, params: dict[str, Any] | None = None, *, wait: float | None = None
    ) -> Sent:
        """Send a command_request to the root and return at once with its id (to follow it).

        The request carries its deadline (now + wait), as `send_command`'s does; `answer()`
        then awaits its result under the same limit (docs/messages.md).
        """
        limit = self.agent.config.request_timeout if wait is None else wait
        deadline = datetime.now(UTC) + timedelta(seconds=limit)
        message = new_message(
            MSG_COMMAND_REQUEST,
            source=self.agent.config.id,
            target=self.root_id,
            details=CommandRequest(
                command=command,
                params=params or {},
                deadline=deadline.isoformat(timespec="milliseconds"),
            ),
            message_source=self.agent.config.message_source,
        )
        started = time.perf_counter()
        tracked = await self.agent.send_message(message, expects_reply=True)
        return Sent(self, tracked, limit, started)

    async def request_status(
        self, request_id: UUID, *, wait: float | None = None
    ) -> dict[str, Any]:
        """Ask the root where a request this operator sent stands; return the nested report.

        Each level answers for its own part and its child's (docs/messages.md, "Lifecycle");
        a request the root never received reads state "unknown".
        """
        report: dict[str, Any] = await self.agent.request_status(request_id, timeout=wait)
        return report

    async def cancel(
        self, request_id: UUID, *, reason: str | None = None, wait: float | None = None
    ) -> dict[str, Any]:
        """Cancel a request this operator sent; return what the cancel has done.

        `state` is `canceled` only once every level confirmed; `canceling` names in `line`
        and `level` the first that has not (VOXAgent.cancel, protocol/canceling.py).
        """
        report: dict[str, Any] = await self.agent.cancel(request_id, reason=reason, timeout=wait)
        return report

    def follow(self, request_id: UUID) -> AsyncIterator[dict[str, Any]]:
        """Return each transition of a request this operator sent, ending after the final one."""
        return self.agent.follow(request_id)

    async def decide(
        self, job: UUID, verdict: str, *, note: str | None = None, wait: float | None = None
    ) -> VOXMessage:
        """Send the human's decision on a job notification to the root; return its answer.

        The decision answers the notification (reply_to), so each ledger's trace of the job
        shows it; once recorded it is kept in decisions.jsonl (CommandFailed if refused).
        """
        # ValueError (pydantic's ValidationError) for a verdict other than approve/reject.
        decision = Decision(in_response_to=job, verdict=verdict, note=note)
        answer = await self.agent.ask(
            MSG_DECISION, decision, to=self.root_id, timeout=wait, reply_to=job
        )
        entry = {
            "job": str(job),
            "verdict": verdict,
            "note": note,
            "decided_at": now_iso(),
            "decision": str(answer.reply_to),
            "outcome": answer.details.get("outcome"),
        }
        _append_line(self.decisions_path, entry)
        return answer

    def decisions(self) -> list[dict[str, Any]]:
        """Return every decision recorded so far, oldest first."""
        return _read_lines(self.decisions_path)

    def jobs(self) -> list[Job]:
        """Return the job notifications, numbered, each with its decision if one was made."""
        return number_jobs(self.notifications(), self.decisions())

    def _keep_notification(self, message: VOXMessage) -> None:
        """Keep what the root reports to the human (note_to_human included) in the inbox file."""
        if message.type in _NOT_NOTIFICATIONS or message.reply_to is not None:
            return
        entry = {
            "received_at": time.time(),
            "message_id": str(message.message_id),
            "emitted_at": message.emitted_at,
            "type": message.type,
            "source": str(message.source),
            "message_source": message.message_source,
            "details": message.details,
        }
        _append_line(self.inbox_path, entry)

    def opened(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Return a kept notification with its sealed note_to_human opened (docs/security.md).

        The inbox file keeps the note sealed; only a reading with the operator's key opens it.
        """
        details = entry.get("details")
        note = details.get("note_to_human") if isinstance(details, dict) else None
        if not isinstance(details, dict) or not is_sealed(note):
            return entry
        signing = self.agent.config.broker.signing
        # Opened as the web console's rows open it: why not, where it cannot be.
        text, sealed = note_of(note, None if signing is None else signing.seal_key)
        return {**entry, "details": {**details, "note_to_human": text or f"({sealed})"}}

    def notifications(self) -> list[dict[str, Any]]:
        """Return every notification kept so far, oldest first."""
        return _read_lines(self.inbox_path)


class Sent:
    """A command sent to the root: its id now, its answer when it comes."""

    def __init__(
        self, console: OperatorConsole, tracked: Any, limit: float, started: float
    ) -> None:
        self._console = console
        self.tracked = tracked
        self.limit = limit
        self.started = started

    @property
    def request_id(self) -> UUID:
        """Return the id the fleet knows this request by (the command_request's message_id)."""
        request_id: UUID = self.tracked.message.message_id
        return request_id

    async def answer(self) -> VOXMessage:
        """Return the command_result; raise CommandFailed on an error, a cancel or the deadline."""
        agent = self._console.agent
        reply: VOXMessage = await agent.reply_to(self.tracked, self.limit, started=self.started)
        return reply


def _append_line(path: Path, entry: dict[str, Any]) -> None:
    """Append one JSON line to a file of the operator's private state dir, durably."""
    private_dir(path.parent)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Return the JSON objects of a file the console appends to, oldest first."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a torn last line after a crash
        if isinstance(entry, dict):  # anything else was never written by this console
            entries.append(entry)
    return entries


WATCH_FILTERS = (ALL_STATUS, PRESENCE_FILTER, WARROOM_FILTER)  # a will lands on the presence
