"""Serving commands: run them locally, delegate them down the tree, resume after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic_core import PydanticSerializationError, to_jsonable_python

from .errors import CommandFailed, InvalidMessage, VoxError
from .messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    CommandError,
    CommandRequest,
    CommandResult,
    ErrorCode,
    VOXMessage,
    new_message,
    parse,
    parse_timestamp,
)
from .roles import ParamsError

if TYPE_CHECKING:
    from .agent import AgentConfig
    from .memory import VOXAgentMemory
    from .roles import Role
    from .status import FleetView
    from .tracking import RequestTracker, TrackedRequest
    from .transport import Session

__all__ = ["CommandsMixin"]

log = logging.getLogger("vox_mqtt.agent")


class CommandsMixin:
    """The command side of VOXAgent (seed 000's flow: run, delegate, answer upstream)."""

    if TYPE_CHECKING:
        config: AgentConfig
        id: UUID
        name: str
        memory: VOXAgentMemory
        tracker: RequestTracker
        fleet_view: FleetView
        session: Session | None
        stopping: bool
        commands: set[str]
        event_router: dict[str, list[Role]]
        _handler_slots: asyncio.Semaphore
        _delegated: dict[UUID, int]
        _running_handlers: int
        _idle: asyncio.Event
        _serving: dict[UUID, VOXMessage]
        _interrupted: list[dict[str, Any]]
        _pending: list[dict[str, Any]]
        _unsent: list[tuple[str, str, bytes]]

        def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...
        async def send_message(
            self, message: VOXMessage, *, expects_reply: bool
        ) -> TrackedRequest: ...
        async def _deliver(self, tracked: TrackedRequest) -> None: ...
        async def _await_reply(self, message: VOXMessage, timeout: float | None) -> VOXMessage: ...
        async def _send_error_to(
            self, peer: UUID, reply_to: UUID, code: str, reason: str
        ) -> None: ...

    async def _answer_unfinished_shutting_down(self) -> None:
        """Answer every command still running after the grace period, then let it be cut."""
        answers = []
        for request in list(self._serving.values()):
            self._serving.pop(request.message_id, None)
            name = str(request.details.get("command", ""))
            error = CommandError(
                code=ErrorCode.SHUTTING_DOWN,
                error=f"{self.name} is stopping and {name!r} did not finish in time",
                command=name or None,
            )
            with contextlib.suppress(VoxError):
                answers.append(
                    await self.send_message(
                        request.reply(MSG_COMMAND_ERROR, error), expects_reply=False
                    )
                )
        # A moment for the answers to be acknowledged; unacknowledged ones stay in the
        # outbox and go out after the next start.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                for tracked in answers:
                    await tracked.acknowledged.wait()

    def _begin_command(self, request: VOXMessage) -> None:
        self._running_handlers += 1
        self._idle.clear()
        self._spawn(self._serve_command(request), "command")

    # --- commands -------------------------------------------------------------------------

    async def _serve_command(self, request: VOXMessage) -> None:
        self._serving[request.message_id] = request
        try:
            details = await self._answer_command(request)
        except Exception as exc:  # the last line of defence: answer, never crash
            log.exception("%s: command failed", self.name)
            details = CommandError(code=ErrorCode.HANDLER_ERROR, error=f"{type(exc).__name__}")
        finally:
            self._running_handlers -= 1
            if self._running_handlers == 0:
                self._idle.set()
        if self._serving.pop(request.message_id, None) is None:
            return  # already answered SHUTTING_DOWN when the grace period ran out
        kind = MSG_COMMAND_RESULT if isinstance(details, CommandResult) else MSG_COMMAND_ERROR
        with contextlib.suppress(VoxError):
            # The reply's "sent" row (with the reply whole in the outbox) is what marks the
            # command finished: from then on a restart re-sends the answer, never re-runs.
            await self.send_message(request.reply(kind, details), expects_reply=False)
            await self.memory.record_message(
                request, "completed" if kind == MSG_COMMAND_RESULT else "failed"
            )

    async def _answer_command(self, request: VOXMessage) -> CommandResult | CommandError:
        payload = CommandRequest.model_validate(request.details)
        name = payload.command
        if self.stopping:
            return CommandError(
                code=ErrorCode.SHUTTING_DOWN, error="agent is stopping", command=name
            )
        timeout = self._timeout_of(payload)
        handler = self._local_handler(name)
        if handler is not None:
            async with self._handler_slots:
                await self.memory.record_message(request, "started")
                return await self._call(handler, name, payload.params, timeout)
        return await self._delegate(request, payload, timeout)

    def _local_handler(self, name: str) -> Callable[..., Awaitable[Any]] | None:
        if name not in self.commands:
            return None
        for role in self.event_router.get(name, []):
            handler = role.get_commands().get(name)
            if handler is not None:
                return handler
        return None

    def _timeout_of(self, payload: CommandRequest) -> float:
        timeout = self.config.request_timeout
        if payload.deadline is not None:
            remaining = parse_timestamp(payload.deadline).timestamp() - time.time()
            timeout = max(0.0, min(timeout, remaining))
        return timeout

    async def _call(
        self,
        handler: Callable[..., Awaitable[Any]],
        name: str,
        params: dict[str, Any],
        timeout: float,
    ) -> CommandResult | CommandError:
        try:
            async with asyncio.timeout(timeout):
                result = await handler(**params)
            result = to_jsonable_python(result)
        except ParamsError as exc:
            return CommandError(code=ErrorCode.INVALID_MESSAGE, error=str(exc), command=name)
        except TimeoutError:
            return CommandError(
                code=ErrorCode.TIMEOUT, error=f"{name} took over {timeout:.1f}s", command=name
            )
        except PydanticSerializationError as exc:
            return CommandError(
                code=ErrorCode.HANDLER_ERROR,
                error=f"{name} returned a result that is not JSON: {exc}",
                command=name,
            )
        except Exception as exc:
            log.exception("%s: command %s raised", self.name, name)
            return CommandError(
                code=ErrorCode.HANDLER_ERROR,
                error=f"{name} failed: {type(exc).__name__}: {exc}"[:500],
                command=name,
            )
        return CommandResult(command=name, result=result, handled_by=self.id)

    def choose_child(self, command: str) -> tuple[UUID | None, str | None]:
        """Pick a child for a command: healthy first, then least busy; else an error code."""
        advertising = [
            entry
            for entry in (self.fleet_view.get(c) for c in self.config.children)
            if entry is not None and command in entry.commands
        ]
        healthy = [entry for entry in advertising if entry.healthy]
        if healthy:
            best = min(healthy, key=lambda e: (self._delegated.get(e.id, 0), random.random()))
            return best.id, None
        return None, ErrorCode.TARGET_INACTIVE if advertising else ErrorCode.NO_ROUTE

    async def _delegate(
        self, request: VOXMessage, payload: CommandRequest, timeout: float
    ) -> CommandResult | CommandError:
        name = payload.command
        child, code = self.choose_child(name)
        if child is None:
            if code == ErrorCode.TARGET_INACTIVE:
                reason = f"no child that serves {name!r} is healthy"
            else:
                # Say what does exist: a typo is then one look away from its fix.
                serves = sorted(self.commands | self.fleet_view.commands_of(self.config.children))
                reason = (
                    f"{self.name} cannot route {name!r}: neither it nor a child serves it; "
                    f"it serves: {', '.join(serves) or 'nothing'}"
                )
            return CommandError(code=code or ErrorCode.NO_ROUTE, error=reason, command=name)
        downstream = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=child,
            details=payload,
            reply_to=request.message_id,
            message_source=self.config.message_source,
        )
        await self.memory.record_message(request, "delegated", outcome=str(child))
        self._delegated[child] = self._delegated.get(child, 0) + 1
        try:
            reply = await self._await_reply(downstream, timeout)
        except CommandFailed as exc:
            return CommandError(code=exc.code, error=exc.error, command=name)
        finally:
            self._delegated[child] -= 1
        result = CommandResult.model_validate(reply.details)
        # The master answers for the work: upstream never learns the child exists.
        return CommandResult(
            command=name, result=result.result, summary=result.summary, handled_by=self.id
        )

    # --- restart --------------------------------------------------------------------------

    async def _resume(self) -> None:
        """After a restart, run commands acknowledged but never started; report interrupted ones."""
        assert self.session is not None
        await self.session.wait_connected(None)
        for _, _, payload in self._unsent:
            try:
                message = parse(payload)
            except InvalidMessage:
                continue
            # Nobody awaits these any more; they only need to reach the peer.
            tracked = self.tracker.track(message, expects_reply=False)
            self._spawn(self._deliver(tracked), "redeliver")
        for row in self._interrupted:
            await self._send_error_to(
                UUID(row["source"]),
                UUID(row["message_id"]),
                ErrorCode.HANDLER_ERROR,
                "the agent restarted while running this command; it is not run twice",
            )
        for row in self._pending:
            request = _request_from_row(row)
            if request is not None and request.source in self.config.peers:
                self._begin_command(request)


def _request_from_row(row: Mapping[str, Any]) -> VOXMessage | None:
    """Rebuild an acknowledged command_request from its ledger row."""
    details = row.get("details") or {}
    try:
        return VOXMessage(
            message_id=UUID(row["message_id"]),
            message_source=details.get("message_source") or "vox-mqtt",
            emitted_at=row["emitted_at"],
            source=UUID(row["source"]),
            target=UUID(row["target"]),
            type=MSG_COMMAND_REQUEST,
            details={"command": details["command"], "params": details.get("params") or {}},
            reply_to=UUID(row["reply_to"]) if row.get("reply_to") else None,
        )
    except (KeyError, TypeError, ValueError):
        log.warning("cannot resume command from ledger row %r", row)
        return None
