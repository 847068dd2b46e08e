"""The console's API for the CLI (`/v1/...`), next to the web console's own (docs/operations.md).

Every verb that acts as the operator asks here, over the console's Unix socket, instead of
logging in itself. Requests and answers are JSON; `POST /v1/send` answers with one JSON
object per line (NDJSON), as the request goes: `{"kind": "request"}` with its id, then with
`mode: follow` each transition (`{"kind": "transition", ...}`, the shape of
`OperatorConsole.follow`), and last its end: `answer`, `failed`, `detached` or `pending`.
Right after the id, `{"kind": "note", "text": ...}` says what the live view knows that the
person should at once (the root is down); the client prints it on stderr.
A client that hangs up leaves the request running: it is the console's, not the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from vox_mqtt.console.decisions import choose_job
from vox_mqtt.console.doorlog import DOORS, record_door, request_doors
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.web_state import WebState
from vox_mqtt.observe.status import ACTIVE
from vox_mqtt.protocol.errors import CommandFailed, VoxError
from vox_mqtt.protocol.messages import VOXMessage, timeout_refused

__all__ = [
    "DOORS",
    "Home",
    "HomeParts",
    "build_home_app",
    "record_door",
    "reply_json",
    "root_down_note",
]

_MAX_BODY: Final = 64 * 1024
_ACK_WAIT: Final = 10.0  # seconds --detach waits for the root's acknowledgement
_AT_ONCE: Final = 1.0  # after the ack, how long an end that comes at once is still awaited
_FINAL_GRACE: Final = 1.0  # after the answer, how long the final transition may take
_STATUS_SETTLE: Final = 2.0  # a console just started gives the retained statuses this long


@dataclass(frozen=True)
class HomeParts:
    """What the verbs' own modules lend the API, so it reads and prints as they do.

    The CLI layer builds it (cli/console.py): this layer imports nothing of the CLI
    (docs/architecture.md, "Layers").
    """

    # The request a person named by its id or the first 4+ digits of it, from the ledger;
    # ValueError with the line to show.
    resolve_request: Callable[[Path, str], UUID]
    # `vox inbox`'s entries, oldest first, read marks aside.
    inbox: Callable[[OperatorConsole], list[dict[str, Any]]]
    # `vox status` from the live view: {"text": ...} or, asked for JSON, {"document": ...}.
    status: Callable[[WebState, dict[str, Any]], dict[str, Any]]
    # `vox warroom`'s rows from the live view.
    warroom: Callable[[WebState], list[dict[str, Any]]]
    # `vox warroom --follow`'s rows: the posts after a number (WebState.posts_since).
    posts: Callable[[WebState, int], dict[str, Any]]
    # One frame of `vox watch` from the live view: {"text": ...} for a terminal, or the
    # change keys and the lines asked for (cli/watchview.py).
    watch: Callable[[WebState, dict[str, Any]], dict[str, Any]]


class Home:
    """What the API serves from: the operator's session and the console's live view."""

    def __init__(
        self,
        console: OperatorConsole,
        state: WebState,
        parts: HomeParts,
        *,
        stop: Callable[[], None],
        activity: Any,
    ) -> None:
        self.console = console
        self.state = state
        self.parts = parts
        self.stop = stop
        self.activity = activity
        self.started = time.monotonic()

    async def settled(self, wait: float) -> None:
        """Let a console that only just started collect for up to `wait` seconds."""
        left = wait - (time.monotonic() - self.started)
        if left > 0:
            await asyncio.sleep(left)


def root_down_note(home: Home, timeout: float) -> str | None:
    """Say, from the live view, that the root is down when it is: None while it is ACTIVE.

    A root whose status this console has not seen yet says nothing (a console that only
    just started); one seen STALE or INACTIVE does: the request is sent all the same, and
    the root answers it if it is back before the request's deadline (docs/operations.md).
    """
    view = home.state.observer.view
    view.refresh()
    root = view.get(home.console.root_id)
    if root is None or not root.seen or root.status == ACTIVE:
        return None
    name = root.name or home.console.file.operator.root_name
    return (
        f"the root ({name}) is {root.status} in the console's live view: the request "
        f"waits for it until its deadline ({timeout:g} s)"
    )


def reply_json(reply: VOXMessage) -> dict[str, Any]:
    """Return a command's answer as the client prints it."""
    return {
        "message_id": str(reply.message_id),
        "reply_to": str(reply.reply_to),
        "details": reply.details,
    }


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, default=str) + "\n").encode()


def _failed(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, CommandFailed):
        return {"kind": "failed", "code": str(exc.code), "error": exc.error}
    return {"kind": "failed", "code": type(exc).__name__, "error": str(exc)}


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > _MAX_BODY:
        raise ValueError("request too large")
    data = json.loads(raw or b"{}")
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


def _json(data: Any, status: int = 200) -> Response:
    """A JSON answer whose ids and times are written as text (the CLI's print_json does so)."""
    return Response(json.dumps(data, default=str), status, media_type="application/json")


def _bad(text: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status)


async def _first(*futures: asyncio.Future[Any]) -> None:
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)


def build_home_app(home: Home, web_api: ASGIApp) -> Starlette:
    """Return the Unix socket's app: `/v1/...` for the CLI, the web console's API besides."""
    console = home.console

    async def hello(_request: Request) -> Response:
        op = console.file.operator
        return JSONResponse(
            {
                "pid": os.getpid(),
                "operator": op.name,
                "root": op.root_name,
                "root_id": str(op.root_id),
                "up_s": round(time.monotonic() - home.started, 3),
                "clients": home.activity.clients,
                "connected": home.state.connected,
            }
        )

    async def stop(_request: Request) -> Response:
        home.stop()
        return JSONResponse({"stopping": True, "pid": os.getpid()})

    async def send(request: Request) -> Response:
        try:
            data = await _body(request)
            command = data["command"]
            params = data.get("params") or {}
            timeout = float(data.get("timeout", 30.0))
            mode = str(data.get("mode", "wait"))
        except (ValueError, KeyError, TypeError):
            return _bad("expected {command, params, timeout, mode}")
        if not isinstance(command, str) or not isinstance(params, dict):
            return _bad("command is a string, params an object")
        if mode not in ("wait", "follow", "detach"):
            return _bad("mode is wait, follow or detach")
        refused = timeout_refused(timeout)  # the request's deadline: 30 days at most
        if refused is not None:
            return _bad(refused)
        door = data.get("door", "cli")
        if door not in DOORS:
            return _bad(f"door is one of {', '.join(DOORS)}")
        note = root_down_note(home, timeout)
        return StreamingResponse(
            _send_stream(console, command, params, timeout, mode, door, note),
            media_type="application/x-ndjson",
        )

    async def cancel(request: Request) -> Response:
        return await _about_request(request, home, "cancel")

    async def request_status(request: Request) -> Response:
        return await _about_request(request, home, "show")

    async def inbox(request: Request) -> Response:
        try:
            data = await _body(request)
            wait = float(data.get("wait", 2.0))
        except (ValueError, TypeError):
            return _bad("expected {wait}")
        await home.settled(wait)
        entries = home.parts.inbox(console)
        return _json({"entries": entries, "inbox_path": str(console.inbox_path)})

    async def decide(request: Request) -> Response:
        try:
            data = await _body(request)
            number = int(data["number"])
            verdict = str(data["verdict"])
            note = data.get("note")
            wait = float(data.get("wait", 30.0))
            door = str(data.get("door", "cli"))
        except (ValueError, KeyError, TypeError):
            return _bad("expected {number, verdict, note, wait, door}")
        if door not in DOORS:
            return _bad(f"door is one of {', '.join(DOORS)}")
        await home.settled(2.0)  # a console just started: the queued notifications first
        chosen = choose_job(console.jobs(), number, now=datetime.now(UTC))
        if isinstance(chosen, str):
            return _json({"ok": False, "code": None, "error": chosen})
        job = UUID(chosen.message_id)
        try:
            answer = await console.decide(job, verdict, note=note, wait=wait)
        except CommandFailed as exc:
            await _decided_via(console, job, door, verdict, None)
            return _json({"ok": False, "code": str(exc.code), "error": exc.error})
        except ValueError as exc:
            return _bad(str(exc))
        await _decided_via(console, job, door, verdict, answer.reply_to)
        return _json(
            {
                "ok": True,
                "job_id": chosen.message_id,
                "outcome": answer.details.get("outcome"),
                "decision": str(answer.reply_to),
            }
        )

    async def status(request: Request) -> Response:
        try:
            data = await _body(request)
            wait = float(data.get("wait", _STATUS_SETTLE))
        except (ValueError, TypeError):
            return _bad("expected {wait, json, width}")
        await home.settled(min(wait, _STATUS_SETTLE))
        return _json(home.parts.status(home.state, data))

    async def warroom(request: Request) -> Response:
        try:
            data = await _body(request)
            wait = float(data.get("wait", _STATUS_SETTLE))
        except (ValueError, TypeError):
            return _bad("expected {wait}")
        since = data.get("since")
        if since is not None:
            if not isinstance(since, int) or isinstance(since, bool):
                return _bad("since: the number of the last post seen, or -1 to start")
            return _json(home.parts.posts(home.state, since))
        await home.settled(min(wait, _STATUS_SETTLE))
        return _json({"rows": home.parts.warroom(home.state)})

    async def watch(request: Request) -> Response:
        try:
            data = await _body(request)
        except (ValueError, TypeError):
            return _bad("expected {plain, width, color, lines}")
        lines = data.get("lines")
        if lines is not None and not (
            isinstance(lines, list) and all(isinstance(i, str) for i in lines)
        ):
            return _bad("lines: a list of agent ids, or null for every agent")
        await home.settled(_STATUS_SETTLE)
        return _json(home.parts.watch(home.state, data))

    routes = [
        Route("/v1/hello", hello),
        Route("/v1/stop", stop, methods=["POST"]),
        Route("/v1/send", send, methods=["POST"]),
        Route("/v1/cancel", cancel, methods=["POST"]),
        Route("/v1/request", request_status, methods=["POST"]),
        Route("/v1/inbox", inbox, methods=["POST"]),
        Route("/v1/decide", decide, methods=["POST"]),
        Route("/v1/status", status, methods=["POST"]),
        Route("/v1/warroom", warroom, methods=["POST"]),
        Route("/v1/watch", watch, methods=["POST"]),
        Mount("/", web_api),
    ]
    return Starlette(routes=routes)


async def _about_request(request: Request, home: Home, what: str) -> Response:
    """`vox cancel` and `vox request show`: the id (or its prefix) resolved from the ledger."""
    console = home.console
    try:
        data = await _body(request)
        text = str(data["request_id"])
        reason = data.get("reason")
        wait = float(data.get("wait", 10.0))
        door = str(data.get("door", "cli"))
    except (ValueError, KeyError, TypeError):
        return _bad("expected {request_id, reason, wait, door}")
    if door not in DOORS:
        return _bad(f"door is one of {', '.join(DOORS)}")
    try:
        request_id = home.parts.resolve_request(console.inbox_path.with_name("logs.db"), text)
    except ValueError as exc:
        return _bad(str(exc))
    try:
        if what == "cancel":
            try:
                report = await console.cancel(request_id, reason=reason, wait=wait)
            finally:  # asked for, whatever the tree answers: the act came through this door
                with contextlib.suppress(VoxError):
                    await record_door(console, request_id, None, door, "cancel")
        else:
            report = await console.request_status(request_id, wait=wait)
    except CommandFailed as exc:
        return JSONResponse({"request_id": str(request_id), **_failed(exc)}, status_code=502)
    except VoxError as exc:
        return JSONResponse({"request_id": str(request_id), **_failed(exc)}, status_code=502)
    found = {"request_id": str(request_id), "report": report}
    with contextlib.suppress(VoxError):
        found.update(await request_doors(console.agent.ledger, request_id))  # door, doors
    return _json(found)


async def _decided_via(
    console: OperatorConsole, job: UUID, door: str, verdict: str, decision: UUID | None
) -> None:
    """Record the door a decision came through, under the job's id (console/doorlog.py)."""
    with contextlib.suppress(VoxError):
        await record_door(
            console,
            job,
            None,
            door,
            "decision",
            verdict=verdict,
            decision=None if decision is None else str(decision),
        )


async def _send_stream(
    console: OperatorConsole,
    command: str,
    params: dict[str, Any],
    timeout: float,
    mode: str,
    door: str = "cli",
    note: str | None = None,
) -> AsyncIterator[bytes]:
    try:
        sent = await console.start_command(command, params, wait=timeout)
    except VoxError as exc:
        yield _line(_failed(exc))
        return
    with contextlib.suppress(VoxError):  # the request is sent: a full disk fails it, not this
        await record_door(console, sent.request_id, command, door)
    yield _line({"kind": "request", "request_id": str(sent.request_id)})
    if note is not None:  # said at once, before any wait (the client prints it on stderr)
        yield _line({"kind": "note", "text": note})
    if mode == "detach":
        yield _line(await _detach(sent))
        return
    answer = asyncio.ensure_future(sent.answer())
    try:
        if mode == "follow":
            async for line in _follow(console, sent.request_id, answer):
                yield line
        else:
            await asyncio.wait({answer})
        try:
            reply = answer.result()
        except VoxError as exc:
            yield _line(_failed(exc))
            return
        yield _line({"kind": "answer", **reply_json(reply)})
    finally:
        # A client that hung up leaves the request running: only this stream's wait ends.
        answer.cancel()
        with contextlib.suppress(asyncio.CancelledError, VoxError):
            await answer


async def _follow(
    console: OperatorConsole, request_id: UUID, answer: asyncio.Future[Any]
) -> AsyncIterator[bytes]:
    """Yield each transition until the answer came (and the final transition, within a grace)."""
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for transition in console.follow(request_id):
                queue.put_nowait(transition)
        finally:
            queue.put_nowait(None)

    pumping = asyncio.ensure_future(pump())
    grace: float | None = None
    try:
        while True:
            getting = asyncio.ensure_future(queue.get())
            waits: set[asyncio.Future[Any]] = {getting}
            if grace is None:
                waits.add(answer)
            done, _ = await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            if getting not in done:
                getting.cancel()
                if grace is not None:
                    return  # the final transition did not come within the grace
                grace = _FINAL_GRACE  # answered: the final transition may still come
                continue
            item = getting.result()
            if item is None:
                return
            yield _line({"kind": "transition", "request_id": str(request_id), **item})
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError, VoxError):
            await pumping


async def _detach(sent: Any) -> dict[str, Any]:
    """`vox send --detach`: wait for the root's ack, and for an end that comes at once."""
    tracked = sent.tracked
    try:
        async with asyncio.timeout(min(sent.limit, _ACK_WAIT)):
            acked = asyncio.ensure_future(tracked.acknowledged.wait())
            done = asyncio.ensure_future(tracked.done.wait())
            try:
                await _first(acked, done)
            finally:
                acked.cancel()
                done.cancel()
    except TimeoutError:
        return {"kind": "pending"}
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tracked.done.wait(), _AT_ONCE)
    if not tracked.done.is_set():
        return {"kind": "detached", "state": "acknowledged"}
    try:
        reply = await sent.answer()
    except VoxError as exc:
        return {**_failed(exc), "at_once": True}
    return {"kind": "detached", "state": "completed", "result": reply.details.get("result")}
