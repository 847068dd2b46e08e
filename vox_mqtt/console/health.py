"""`vox exporter`'s /health: whether the exporter can see the fleet, as one JSON answer.

200 while its broker session is up, 503 otherwise (a probe, a load balancer, systemd's
ExecStartPost or an orchestrator reads the code); the body says why and counts the agents
seen by state. /metrics stays served either way (docs/metrics.md).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from vox_mqtt.observe.status import AgentLiveness

__all__ = ["health", "serve_metrics", "with_health"]

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


class _Quiet(WSGIRequestHandler):
    """Log no request line: a scrape every 15 s is not news (prometheus_client does the same)."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve_metrics(
    host: str,
    port: int,
    metrics: WsgiApp,
    *,
    health: Callable[[], tuple[int, dict[str, Any]]],
) -> tuple[WSGIServer, threading.Thread]:
    """Serve /metrics (the metrics WSGI app) and /health in a daemon thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    app = with_health(metrics, health)
    server = make_server(host, port, app, Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
