"""The web console's HTTP side (docs/web.md): a Starlette app over a `WebState`.

Pages are static files (plain HTML, CSS and JS in `console/static/`); the data is JSON:
`/api/snapshot` for a first paint, `/api/events` (server-sent events: a snapshot, then one
batch per push interval with what changed), `/api/agent/{id}` for an agent's page,
`/api/inbox`, `/api/requests` and `/api/request/{id}` for the operator's pages (with the
operator's console config: `OperatorPages`), and `POST /api/send` for a command to the
root, only when the console was started with a sender (`vox web --allow-send`). Every
response carries a Content-Security-Policy that allows no inline script; with a token,
every request without it gets 401; every POST must carry the page's CSRF token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final
from uuid import UUID

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vox_mqtt.console.commandform import params_problem
from vox_mqtt.console.doors import HostGuard, HostRule
from vox_mqtt.console.web_operator import OperatorPages
from vox_mqtt.console.web_state import WebState, same_secret

__all__ = [
    "OPERATOR_PROVEN",
    "PUSH_INTERVAL",
    "TOKEN_COOKIE",
    "Hub",
    "Sender",
    "build_app",
    "operator_proven",
]

PUSH_INTERVAL: Final = 0.25  # seconds between two batches to the browsers
TOKEN_COOKIE: Final = "vox_web_token"
CSRF_HEADER: Final = "x-csrf-token"
OPERATOR_PROVEN: Final = "vox_operator_proven"  # scope state: the request proved the operator
_KEEPALIVE: Final = 15.0  # an SSE comment this often keeps proxies from closing the stream
_QUEUE: Final = 64  # batches a slow browser may fall behind before it is sent a snapshot
_MAX_BODY: Final = 64 * 1024
_MAX_NOTE: Final = 2000  # a decision's note or a cancel's reason, as `vox decide` bounds it
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS: Final = (
    (b"content-security-policy", _CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)


@dataclass(frozen=True)
class Sender:
    """What `--allow-send` gives the page: the root's commands and a way to send one, and
    the operator's other acts as the CLI does them (`vox decide`, `vox cancel`, `vox request
    show`), each answering JSON: {"ok": ...} or {"ok": False, "code", "error"}."""

    commands: Callable[[], Sequence[str]]
    send: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
    # (job number, verdict, note) -> as `vox decide --json` answers
    decide: Callable[[int, str, str | None], Awaitable[dict[str, Any]]] | None = None
    # (request id, reason) -> {"ok", "report"} as `vox cancel` gets it
    cancel: Callable[[str, str | None], Awaitable[dict[str, Any]]] | None = None
    # request id -> {"ok", "report"}: every level's state, as `vox request show` gets it
    show: Callable[[str], Awaitable[dict[str, Any]]] | None = None


@dataclass
class Hub:
    """Push each batch of the state to every open event stream, at most every interval."""

    state: WebState
    interval: float = PUSH_INTERVAL
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _queues: set[asyncio.Queue[str | None]] = field(default_factory=set)

    def subscribe(self) -> tuple[str, asyncio.Queue[str | None]]:
        """Return a snapshot event and the queue of the batches after it."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=_QUEUE)
        self._queues.add(queue)
        return _event("snapshot", self.state.snapshot()), queue

    def unsubscribe(self, queue: asyncio.Queue[str | None]) -> None:
        """Forget a stream that ended."""
        self._queues.discard(queue)

    def notify(self, name: str, data: dict[str, Any]) -> None:
        """Send one event to every stream now (a full queue drops it: a snapshot follows)."""
        text = _event(name, data)
        for queue in self._queues:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(text)

    def push(self) -> None:
        """Send what changed to every stream (a browser too far behind gets a snapshot)."""
        batch = self.state.flush()
        if batch is None or not self._queues:
            return
        text = _event("batch", batch)
        snapshot: str | None = None
        for queue in self._queues:
            if queue.full():
                while not queue.empty():
                    queue.get_nowait()
                snapshot = snapshot or _event("snapshot", self.state.snapshot())
                queue.put_nowait(snapshot)
            else:
                queue.put_nowait(text)

    async def run(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Push batches until stopping() says so, then end every stream."""
        try:
            while not stopping():
                await asyncio.sleep(self.interval)
                self.push()
        finally:
            self.close()

    def close(self) -> None:
        """End every open stream."""
        self.closed.set()
        for queue in self._queues:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class _Guard:
    """Security headers on every response; the token on every request when one is set."""

    def __init__(self, app: ASGIApp, token: str | None, secure: bool = False) -> None:
        self.app = app
        self.token = token
        self.secure = secure  # served over TLS: the cookie is sent over TLS only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        if self.token is not None:
            request = Request(scope)
            given = request.cookies.get(TOKEN_COOKIE)
            bearer = request.headers.get("authorization", "")
            if bearer.lower().startswith("bearer "):
                given = bearer[7:].strip()
            query = request.query_params.get("token")
            if query is not None and request.method == "GET" and same_secret(query, self.token):
                # The printed URL carries the token once; the browser keeps it as a cookie.
                # Only a path of this console: a browser reads "//host/x" (or "/\host/x")
                # as another site (docs/security.md, "Costs ...", the redirect).
                local = "/" + request.url.path.lstrip("/\\")
                response: Response = RedirectResponse(local, status_code=303)
                response.set_cookie(
                    TOKEN_COOKIE,
                    self.token,
                    httponly=True,
                    samesite="strict",
                    path="/",
                    secure=self.secure,
                )
                await response(scope, receive, secured)
                return
            if not same_secret(given, self.token):
                refusal = PlainTextResponse(
                    "401: this console needs its token (open the URL `vox web` printed)\n",
                    status_code=401,
                    headers={"www-authenticate": 'Bearer realm="vox web"'},
                )
                await refusal(scope, receive, secured)
                return
            # The token proves the operator: sealed notes open for this request (F28).
            scope.setdefault("state", {})[OPERATOR_PROVEN] = True
        await self.app(scope, receive, secured)


def operator_proven(request: Request) -> bool:
    """Return whether this request proved the operator (docs/security.md, F28).

    Only the token does, whatever the address: a loopback console without one serves any
    local process, so it opens no note. A server that proves the operator otherwise (a
    local socket's peer credentials) sets the same mark in the request's scope state.
    """
    return request.scope.get("state", {}).get(OPERATOR_PROVEN) is True


def _page(csrf: str, can_send: bool, operator: bool) -> str:
    text = resources.files("vox_mqtt.console").joinpath("static/index.html").read_text("utf-8")
    # The values are the server's own (hex, digits): nothing from an agent is put here.
    text = text.replace("{{csrf}}", csrf).replace("{{send}}", "1" if can_send else "0")
    return text.replace("{{operator}}", "1" if operator else "0")


def build_app(
    hub: Hub,
    *,
    token: str | None = None,
    sender: Sender | None = None,
    allowed_hosts: HostRule | None = None,
    csrf: str | None = None,
    operator: OperatorPages | None = None,
    secure: bool = False,
) -> Starlette:
    """Return the console's ASGI app over the hub's state.

    allowed_hosts is the door's Host rule (console/doors.py, docs/security.md F27): None
    answers any Host, for a caller that checks it itself.
    """
    csrf = csrf or secrets.token_hex(32)
    page = _page(csrf, sender is not None, operator is not None)
    state = hub.state
    if operator is not None and operator.live_names is None:
        operator.live_names = state.names  # names everywhere, never raw ids (docs/web.md)
    no_operator = {
        "error": "the inbox and the requests are the operator's: start vox web with the "
        "operator's console config"
    }

    async def inbox(request: Request) -> Response:
        if operator is None:
            return JSONResponse(no_operator, status_code=404)
        return JSONResponse(operator.inbox(proven=operator_proven(request)))

    async def requests(_request: Request) -> Response:
        if operator is None:
            return JSONResponse(no_operator, status_code=404)
        return JSONResponse(await operator.requests(state.wall()))

    async def one_request(request: Request) -> Response:
        if operator is None:
            return JSONResponse(no_operator, status_code=404)
        try:
            message_id = UUID(request.path_params["message"])
        except ValueError:
            return JSONResponse({"error": "not a message id"}, status_code=400)
        found = await operator.request(message_id, state.wall())
        if found is None:
            return JSONResponse(
                {"error": "no request of the operator's with this id in its ledger"},
                status_code=404,
            )
        return JSONResponse(found)

    async def index(_request: Request) -> Response:
        return HTMLResponse(page)

    async def snapshot(_request: Request) -> Response:
        return JSONResponse(state.snapshot())

    async def agent(request: Request) -> Response:
        try:
            agent_id = UUID(request.path_params["agent"])
        except ValueError:
            return JSONResponse({"error": "not an agent id"}, status_code=400)
        found = state.agent_page(agent_id)
        if found is None:
            return JSONResponse({"error": "no such agent seen"}, status_code=404)
        return JSONResponse(found)

    def specs() -> dict[str, Any]:
        if sender is None:
            return {}
        root = state.root_of_top()
        return {} if root is None else state.command_specs(root, sorted(sender.commands()))

    async def commands(_request: Request) -> Response:
        if sender is None:
            return JSONResponse({"allowed": False, "commands": [], "specs": {}})
        listed = sorted(sender.commands())
        return JSONResponse({"allowed": True, "commands": listed, "specs": specs()})

    async def posted(request: Request) -> dict[str, Any] | Response:
        """The checks of every POST: a sender, the CSRF token, JSON, a bounded body."""
        if sender is None:
            return JSONResponse(
                {"error": "this console was started without --allow-send: it sends nothing"},
                status_code=403,
            )
        if not same_secret(request.headers.get(CSRF_HEADER), csrf):
            return JSONResponse({"error": "missing or wrong CSRF token"}, status_code=403)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "send JSON"}, status_code=415)
        body = await request.body()
        if len(body) > _MAX_BODY:
            return JSONResponse({"error": "request too large"}, status_code=413)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            return JSONResponse({"error": "expected a JSON object"}, status_code=400)
        return data

    async def decide(request: Request) -> Response:
        data = await posted(request)
        if isinstance(data, Response):
            return data
        assert sender is not None
        number, verdict, note = data.get("number"), data.get("verdict"), data.get("note")
        if not isinstance(number, int) or isinstance(number, bool):
            return JSONResponse({"error": "number is the job's number"}, status_code=400)
        if verdict not in ("approve", "reject"):
            return JSONResponse({"error": "verdict is approve or reject"}, status_code=400)
        if note is not None and (not isinstance(note, str) or len(note) > _MAX_NOTE):
            return JSONResponse(
                {"error": f"the note is text of at most {_MAX_NOTE} characters"}, status_code=400
            )
        if sender.decide is None:
            return JSONResponse({"error": "this console does not decide"}, status_code=404)
        return JSONResponse(await sender.decide(number, verdict, note or None))

    async def about_request(request: Request) -> Response:
        data = await posted(request)
        if isinstance(data, Response):
            return data
        assert sender is not None
        try:
            message_id = str(UUID(request.path_params["message"]))
        except ValueError:
            return JSONResponse({"error": "not a message id"}, status_code=400)
        what = request.path_params["what"]
        if what == "cancel" and sender.cancel is not None:
            reason = data.get("reason")
            if reason is not None and (not isinstance(reason, str) or len(reason) > _MAX_NOTE):
                return JSONResponse({"error": "the reason is short text"}, status_code=400)
            return JSONResponse(await sender.cancel(message_id, reason or None))
        if what == "levels" and sender.show is not None:
            return JSONResponse(await sender.show(message_id))
        return JSONResponse({"error": f"this console does not {what}"}, status_code=404)

    async def events(request: Request) -> Response:
        first, queue = hub.subscribe()

        async def stream() -> AsyncIterator[str]:
            try:
                yield first
                while not hub.closed.is_set():
                    try:
                        async with asyncio.timeout(_KEEPALIVE):
                            item = await queue.get()
                    except TimeoutError:
                        yield ": keepalive\n\n"
                        continue
                    if item is None:
                        return
                    yield item
            finally:
                hub.unsubscribe(queue)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )

    async def send(request: Request) -> Response:
        data = await posted(request)
        if isinstance(data, Response):
            return data
        assert sender is not None
        try:
            command = data["command"]
            params = data.get("params") or {}
        except (KeyError, TypeError, AttributeError):
            return JSONResponse({"error": "expected {command, params}"}, status_code=400)
        if not isinstance(command, str) or not isinstance(params, dict):
            return JSONResponse({"error": "command is a string, params an object"}, status_code=400)
        if command not in sender.commands():
            return JSONResponse(
                {"error": f"the root does not advertise {command!r}"}, status_code=409
            )
        problem = params_problem(specs().get(command), params)
        if problem is not None:
            return JSONResponse({"error": f"{command}: {problem}"}, status_code=400)
        answer = await sender.send(command, params)
        return JSONResponse(answer)

    routes = [
        Route("/", index),
        Route("/api/snapshot", snapshot),
        Route("/api/events", events),
        Route("/api/agent/{agent}", agent),
        Route("/api/commands", commands),
        Route("/api/inbox", inbox),
        Route("/api/requests", requests),
        Route("/api/request/{message}", one_request),
        Route("/api/send", send, methods=["POST"]),
        Route("/api/decide", decide, methods=["POST"]),
        Route("/api/request/{message}/{what}", about_request, methods=["POST"]),
        Mount(
            "/static",
            StaticFiles(packages=[("vox_mqtt.console", "static")]),
            name="static",
        ),
    ]
    middleware = [
        # The Host first: a rebound name gets 421 before the token or a redirect (F27).
        Middleware(HostGuard, rule=allowed_hosts, counters=None),
        Middleware(_Guard, token=token, secure=secure),
    ]
    return Starlette(routes=routes, middleware=middleware)
