"""The fleet's root as an A2A v1.0 agent, served by the operator's console (docs/a2a.md).

`vox console serve --a2a HOST:PORT` serves, on the official `a2a-sdk`'s Starlette routes,
the agent card at the well-known path, the JSON-RPC binding at `/` and the HTTP+JSON
binding under `/rest`. Its request handler
is this module's `FleetTasks`, not the SDK's task store: a task is the operator's request
(task id = request id), it runs in the console's session, and its state is the request's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID, uuid4

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types import (
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    InvalidParamsError,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    PushNotificationNotSupportedError,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskNotFoundError,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from vox_mqtt.console.doorlog import record_door
from vox_mqtt.console.home.a2acard import agent_card
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.web_state import same_secret
from vox_mqtt.protocol.errors import CommandFailed, VoxError

__all__ = ["FleetTasks", "build_a2a_app", "parse_message", "task_state_of"]

_LIMIT: Final = 3600.0  # a request's deadline through the tree, as `vox send --timeout` at most
_SEND_WAIT: Final = 600.0  # how long a blocking message/send holds the client at most
_CANCEL_WAIT: Final = 10.0  # how long tasks/cancel waits for the tree to confirm
_FINISHED: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
# Codes a command_error carries when the request was refused before it ran (messages.md).
_REFUSED: Final = frozenset(
    {"NO_ROUTE", "INVALID_MESSAGE", "UNAUTHORIZED_SOURCE", "SHUTTING_DOWN", "BUSY",
     "LEDGER_UNAVAILABLE", "MESSAGE_TOO_LARGE", "TARGET_INACTIVE"}
)  # fmt: skip
# `vox request show`'s states through the tree -> A2A's.
_REPORTED: Final = {
    "sent": TaskState.TASK_STATE_SUBMITTED,
    "received": TaskState.TASK_STATE_SUBMITTED,
    "acknowledged": TaskState.TASK_STATE_WORKING,
    "working": TaskState.TASK_STATE_WORKING,
    "delegated": TaskState.TASK_STATE_WORKING,
    "dispatched": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "expired": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
    "rejected": TaskState.TASK_STATE_REJECTED,
}


def task_state_of(code: str) -> TaskState:
    """Return the A2A state a command_error's code ends a task in."""
    if code == "CANCELED":
        return TaskState.TASK_STATE_CANCELED
    return TaskState.TASK_STATE_REJECTED if code in _REFUSED else TaskState.TASK_STATE_FAILED


def _value(text: str) -> Any:
    """`key=value` as `vox send` reads it: JSON when it parses, else the text itself."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_message(parts: list[dict[str, Any]], skills: list[str]) -> tuple[str, dict[str, Any]]:
    """Return (command, params) from a message's parts; ValueError naming the skills.

    A data part {"command": ..., "params": {...}}, or a text part `command key=value ...`
    (the CLI's form). The first part that is either wins.
    """
    offered = ", ".join(skills) or "none advertised yet"
    for part in parts:
        data = part.get("data")
        if isinstance(data, dict) and isinstance(data.get("command"), str):
            params = data.get("params") or {}
            if not isinstance(params, dict):
                raise ValueError("params is an object of the handler's keyword arguments")
            return data["command"], params
        text = part.get("text")
        if isinstance(text, str) and text.strip():
            try:
                words = shlex.split(text)
            except ValueError as exc:
                raise ValueError(f"the text part does not parse: {exc}") from None
            command, params = words[0], {}
            for word in words[1:]:
                key, eq, value = word.partition("=")
                if not eq or not key:
                    raise ValueError(f"expected key=value, not {word!r}; skills: {offered}")
                params[key] = _value(value)
            return command, params
    raise ValueError(
        'expected a data part {"command", "params"} or a text part "command key=value"; '
        f"skills: {offered}"
    )


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Record:
    """One task: the operator's request, as this door has seen it."""

    request_id: str
    context_id: str
    command: str
    state: TaskState = TaskState.TASK_STATE_SUBMITTED
    text: str | None = None
    result: Any = None
    answered: bool = False
    at: datetime = field(default_factory=_now)
    created: float = field(default_factory=time.time)
    watchers: list[asyncio.Queue[TaskStatusUpdateEvent | None]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def status(self) -> TaskStatus:
        status = TaskStatus(state=self.state)
        status.timestamp.FromDatetime(self.at)
        if self.text is not None:
            status.message.CopyFrom(
                Message(
                    message_id=str(uuid4()),
                    role=Role.ROLE_AGENT,
                    task_id=self.request_id,
                    context_id=self.context_id,
                    parts=[Part(text=self.text)],
                )
            )
        return status

    def task(self) -> Task:
        task = Task(id=self.request_id, context_id=self.context_id, status=self.status())
        task.metadata.update({"command": self.command})
        if self.answered:
            artifact = Artifact(artifact_id=f"{self.request_id}-result", name="result")
            part = artifact.parts.add()
            part.data.struct_value.update({"result": self.result})
            task.artifacts.append(artifact)
        return task

    def move(self, state: TaskState, text: str | None) -> None:
        self.state, self.text, self.at = state, text, _now()
        if self.watchers:  # built for those who stream it; tasks/get builds its own
            event = TaskStatusUpdateEvent(
                task_id=self.request_id, context_id=self.context_id, status=self.status()
            )
            for queue in self.watchers:
                queue.put_nowait(event)
        if state in _FINISHED:
            self.done.set()
            for queue in self.watchers:
                queue.put_nowait(None)


def _words(transition: dict[str, Any]) -> str:
    """A transition as a status message: the state, the handler's text and fraction."""
    words = str(transition.get("state"))
    level: Any = transition.get("details") or {}
    text = fraction = None
    for _ in range(32):  # the deepest level is the handler's own report (messages.md)
        if not isinstance(level, dict):
            break
        text = level.get("text", text)
        fraction = level.get("fraction", fraction)
        level = level.get("below")
    if isinstance(text, str):
        words += f": {text}"
    if isinstance(fraction, int | float):
        words += f" ({fraction:.0%})"
    return words


# The ledger's request states (console/web_operator.py, request_rows) -> A2A's.
_LEDGER: Final = {
    "SENT": TaskState.TASK_STATE_SUBMITTED,
    "ACKNOWLEDGED": TaskState.TASK_STATE_WORKING,
    "PROGRESS": TaskState.TASK_STATE_WORKING,
    "ANSWERED": TaskState.TASK_STATE_COMPLETED,
    "EXPIRED": TaskState.TASK_STATE_FAILED,
}


def ledger_task(row: dict[str, Any]) -> Task:
    """Return a request as the ledger tells it (no artifact: the answer is not kept there)."""
    request_id = str(row.get("message_id"))
    code = row.get("code")
    found = str(row.get("state"))
    state = task_state_of(str(code or "")) if found == "FAILED" else _LEDGER.get(found)
    task = Task(
        id=request_id,
        context_id=request_id,
        status=TaskStatus(state=state or TaskState.TASK_STATE_UNSPECIFIED),
    )
    if isinstance(row.get("command"), str):
        task.metadata.update({"command": row["command"]})
    when = row.get("ended_at") or row.get("sent_at")
    with contextlib.suppress(TypeError, ValueError):
        task.status.timestamp.FromDatetime(datetime.fromisoformat(str(when)))
    if code or row.get("reason"):
        words = f"{code}: {row.get('reason') or ''}" if code else str(row.get("reason"))
        task.status.message.CopyFrom(
            Message(message_id=str(uuid4()), role=Role.ROLE_AGENT, parts=[Part(text=words)])
        )
    return task


class FleetTasks(RequestHandler):
    """A2A's methods answered from the operator's requests (docs/a2a.md, "Mapping")."""

    def __init__(
        self,
        console: OperatorConsole,
        skills: Callable[[], dict[str, dict[str, Any]]],
        ledger: Any = None,
    ) -> None:
        self.console = console
        self.skills = skills
        self.ledger = ledger  # the operator's OperatorPages (console/web_operator.py), or None
        self.tasks: dict[str, _Record] = {}
        self.by_message: dict[str, str] = {}  # A2A message id -> request id: sent once
        self._starting: dict[str, asyncio.Future[_Record]] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def _start(self, params: SendMessageRequest) -> _Record:
        message = params.message
        key = message.message_id
        known = self.by_message.get(key)
        if known is not None:
            return self.tasks[known]
        if key in self._starting:  # the same message id at once: one request
            return await asyncio.shield(self._starting[key])
        parts = [MessageToDict(p, preserving_proto_field_name=True) for p in message.parts]
        try:
            command, args = parse_message(parts, sorted(self.skills()))
        except ValueError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        starting: asyncio.Future[_Record] = asyncio.get_running_loop().create_future()
        self._starting[key] = starting
        try:
            try:
                sent = await self.console.start_command(command, args, wait=_LIMIT)
            except VoxError as exc:
                raise InvalidParamsError(message=f"{command}: {exc}") from None
            with contextlib.suppress(VoxError):  # sent: a full disk fails it, not this
                await record_door(self.console, sent.request_id, command, "a2a")
            request_id = str(sent.request_id)
            record = _Record(request_id, message.context_id or request_id, command)
            self.tasks[request_id] = record
            self.by_message[key] = request_id
            starting.set_result(record)
        except BaseException as exc:
            starting.set_exception(exc)
            starting.exception()  # retrieved: a lone sender's error is raised below, not logged
            raise
        finally:
            self._starting.pop(key, None)
        runner = asyncio.ensure_future(self._drive(record, sent))
        self._running.add(runner)
        runner.add_done_callback(self._running.discard)
        return record

    async def _drive(self, record: _Record, sent: Any) -> None:
        """Follow the request to its end, telling each transition to the task's watchers."""

        async def pump() -> None:
            async for transition in self.console.follow(sent.request_id):
                state = transition.get("state")
                if state in ("acknowledged", "working", "delegated", "progress"):
                    record.move(TaskState.TASK_STATE_WORKING, _words(transition))

        pumping = asyncio.ensure_future(pump())
        try:
            reply = await sent.answer()
        except CommandFailed as exc:
            await _settle(pumping, record)
            record.move(task_state_of(str(exc.code)), f"{exc.code}: {exc.error}")
            return
        except VoxError as exc:
            await _settle(pumping, record)
            record.move(TaskState.TASK_STATE_FAILED, f"{type(exc).__name__}: {exc}")
            return
        await _settle(pumping, record)
        record.result = reply.details.get("result")
        record.answered = True
        record.move(TaskState.TASK_STATE_COMPLETED, None)

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        record = await self._start(params)
        if not params.configuration.return_immediately:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.done.wait(), _SEND_WAIT)
        return record.task()

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[StreamResponse | Any]:
        record = await self._start(params)
        async for event in self._events(record):
            yield event

    async def _events(self, record: _Record) -> AsyncGenerator[Any]:
        queue: asyncio.Queue[TaskStatusUpdateEvent | None] = asyncio.Queue()
        record.watchers.append(queue)
        try:
            yield record.task()
            if record.done.is_set():
                return
            while (event := await queue.get()) is not None:
                yield event
        finally:
            record.watchers.remove(queue)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        record = self.tasks.get(params.id)
        if record is None:
            raise TaskNotFoundError(message=f"no task {params.id} in flight at this console")
        async for event in self._events(record):
            yield event

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        record = self.tasks.get(params.id)
        if record is not None:
            return record.task()
        # Not sent through this door since the console started: ask the tree.
        try:
            request_id = UUID(params.id)
            report = await self.console.request_status(request_id, wait=10.0)
        except (ValueError, VoxError):
            return None
        state = _REPORTED.get(str(report.get("state")))
        if state is None:
            return None
        found = Task(id=params.id, context_id=params.id, status=TaskStatus(state=state))
        found.status.timestamp.FromDatetime(_now())
        return found

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        rows = await self._listed()
        if params.context_id:
            rows = [t for t in rows if t.context_id == params.context_id]
        if params.status:
            rows = [t for t in rows if t.status.state == params.status]
        size = params.page_size or 50
        start = int(params.page_token) if params.page_token.isdigit() else 0
        page = rows[start : start + size]
        if not params.include_artifacts:  # the spec's default: statuses only
            for task in page:
                del task.artifacts[:]
        more = start + size < len(rows)
        return ListTasksResponse(
            tasks=page,
            next_page_token=str(start + size) if more else "",
            page_size=size,
            total_size=len(rows),
        )

    async def _listed(self) -> list[Task]:
        """The operator's requests, newest first: the ledger's, this door's where it has one.

        The ledger (console/web_operator.py, the web console's requests page) knows every
        request the operator sent, by any door; the tasks this door follows carry more
        (their artifact, their status message).
        """
        mine = sorted(self.tasks.values(), key=lambda r: r.created, reverse=True)
        if self.ledger is None:
            return [r.task() for r in mine]
        # A request's caller gets its answer beside the commit of the answer's row, not after
        # it (agent/inbound.py, _commit), and the ledger is read on a connection of its own:
        # an answer `vox send` already printed is listed completed, not still working.
        await self.console.agent.ledger.settled()
        found = await self.ledger.requests(time.time())
        listed: list[Task] = []
        seen: set[str] = set()
        for row in found.get("requests", []):
            request_id = str(row.get("message_id"))
            seen.add(request_id)
            record = self.tasks.get(request_id)
            listed.append(record.task() if record is not None else ledger_task(row))
        # Sent in the instant before the ledger was read: newest, so first.
        return [r.task() for r in mine if r.request_id not in seen] + listed

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        record = self.tasks.get(params.id)
        try:
            request_id = UUID(params.id)
        except ValueError:
            return None
        if record is None:
            return None
        if not record.done.is_set():
            with contextlib.suppress(VoxError):
                try:
                    await self.console.cancel(
                        request_id, reason="A2A tasks/cancel", wait=_CANCEL_WAIT
                    )
                finally:  # the operator's ledger says which door the cancel came through
                    await record_door(self.console, request_id, record.command, "a2a", "cancel")
            # Canceled only when the tree confirms it: the request's own end says so.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.done.wait(), _CANCEL_WAIT)
        return record.task()

    async def on_create_task_push_notification_config(self, *args: Any, **kw: Any) -> Any:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(self, *args: Any, **kw: Any) -> Any:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(self, *args: Any, **kw: Any) -> Any:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(self, *args: Any, **kw: Any) -> Any:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, *args: Any, **kw: Any) -> Any:
        raise UnsupportedOperationError

    async def close(self) -> None:
        for runner in list(self._running):
            runner.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)


async def _settle(pumping: asyncio.Future[None], record: _Record) -> None:
    """Let the follow pump tell what came before the end, then stop it.

    What the tree reported before the answer is already in the follower's queue: a few
    turns of the loop pass it on in order, to those who stream the task. Nobody streams
    it (a blocking message/send): the end replaces whatever came before, at once. No wait
    for the final transition itself: the answer is the end.
    """
    for _ in range(8 if record.watchers else 0):
        if pumping.done():
            break
        await asyncio.sleep(0)
    pumping.cancel()
    with contextlib.suppress(asyncio.CancelledError, VoxError):
        await pumping


class _Bearer:
    """The token on every call but the card's (docs/a2a.md, "Security"; docs/security.md)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or scope["path"].startswith("/.well-"):
            await self.app(scope, receive, send)
            return
        given = Request(scope).headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not same_secret(value.strip(), self.token):
            answer = JSONResponse({"error": "a bearer token is required"}, status_code=401)
            answer.headers["WWW-Authenticate"] = "Bearer"
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_a2a_app(
    handler: FleetTasks, name: str, url: str, token: str | None
) -> tuple[ASGIApp, Callable[[], Awaitable[None]]]:
    """Return the A2A door's app (card + JSON-RPC at `/`) and what closes it."""

    async def card_now(card: Any) -> Any:
        # The card follows the root's commands as they change.
        return agent_card(name, url, handler.skills(), token=token is not None)

    routes = [
        *create_agent_card_routes(agent_card(name, url, {}, token=token is not None), card_now),
        *create_jsonrpc_routes(handler, "/"),
        # Under /rest: the binding's tenant mount would take every other path of `/`.
        *create_rest_routes(handler, path_prefix="/rest"),
    ]
    return _Bearer(Starlette(routes=routes), token), handler.close


def a2a_app(
    console: OperatorConsole, state: Any, url: str, token: str | None, ledger: Any = None
) -> tuple[ASGIApp, Callable[[], Awaitable[None]]]:
    """Return the door's app for the console's session and live view (console/home/server.py)."""
    op = console.file.operator

    def skills() -> dict[str, dict[str, Any]]:
        # The root's advertised commands and what each takes, from the console's live view.
        root = state.observer.view.get(op.root_id)
        if root is None:
            return {}
        return {command: dict(root.params.get(command) or {}) for command in root.commands}

    return build_a2a_app(FleetTasks(console, skills, ledger), op.root_name, url, token)
