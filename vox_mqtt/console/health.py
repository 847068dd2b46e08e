"""`vox exporter`'s /health: whether the exporter can see the fleet, as one JSON answer.

200 while its broker session is up, 503 otherwise (a probe, a load balancer, systemd's
ExecStartPost or an orchestrator reads the code); the body says why and counts the agents
seen by state. /metrics stays served either way (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from vox_mqtt.observe.status import AgentLiveness

__all__ = ["asgi_of", "health", "with_health"]

HEALTH_PATH = "/health"


def health(*, connected: bool, agents: Iterable[AgentLiveness]) -> tuple[int, dict[str, Any]]:
    """Return the HTTP status and the JSON body of /health (a pure function)."""
    by_state = Counter(agent.status for agent in agents if agent.seen or agent.rejected)
    body: dict[str, Any] = {
        "status": "ok" if connected else "unavailable",
        "broker": "connected" if connected else "disconnected",
        "agents": sum(by_state.values()),
        "by_state": dict(sorted(by_state.items())),
    }
    if not connected:
        body["reason"] = "the exporter has no broker session: the agents' series are stale"
    return (200 if connected else 503), body


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def with_health(app: WsgiApp, answer: Callable[[], tuple[int, dict[str, Any]]]) -> WsgiApp:
    """Wrap the metrics app so that GET /health gets `answer()`, everything else the app."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        if environ.get("PATH_INFO") != HEALTH_PATH:
            yield from app(environ, start_response)
            return
        code, body = answer()
        data = json.dumps(body, sort_keys=True).encode() + b"\n"
        reason = "OK" if code == 200 else "Service Unavailable"
        start_response(
            f"{code} {reason}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        yield data

    return wrapped


def asgi_of(app: WsgiApp) -> ASGIApp:
    """Serve a WSGI app (the metrics and /health) as ASGI, one call in a worker thread each.

    The exporter's door is the web console's (console/doors.py: bounded connections and
    timeouts, docs/security.md F29); the app stays WSGI, where its tests are. Its body is
    built in asyncio's default executor (a bounded pool), off the loop the broker link runs on.
    """

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        environ: dict[str, Any] = {
            "REQUEST_METHOD": scope["method"],
            "PATH_INFO": scope["path"],
            "QUERY_STRING": scope["query_string"].decode("latin-1"),
            "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
            "wsgi.url_scheme": scope.get("scheme", "http"),
        }
        for key, value in scope["headers"]:
            name = "HTTP_" + key.decode("latin-1").upper().replace("-", "_")
            environ[name] = value.decode("latin-1")

        def run() -> tuple[str, list[tuple[str, str]], bytes]:
            started: list[Any] = []

            def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
                started[:] = [status, headers]

            body = b"".join(app(environ, start_response))
            return started[0], started[1], body

        status, headers, body = await asyncio.to_thread(run)
        await send(
            {
                "type": "http.response.start",
                "status": int(status.split()[0]),
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return asgi
