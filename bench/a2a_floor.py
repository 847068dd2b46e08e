"""What the a2a-sdk itself costs per call: the floor under figure 19's A2A door.

The experiment that removes the fleet and the console: one process serves, on uvicorn
and Starlette over TCP as the console's door does, the SDK's own JSON-RPC routes whose
handler answers `message/send` at once with a completed task, and beside them a plain
JSON POST route that answers at once. The SDK's own client sends `message/send`; a plain
httpx client posts the same data part, on TCP and on a Unix socket (the console's own
door is one). Interleaved, N times each, one run. The differences of the medians are what
any door built on the SDK pays over plain HTTP, and over a local socket, before it does
any work of its own (docs/a2a.md, "Cost").

    python -m bench.a2a_floor [N]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx

_WARM = 50


def _app() -> Any:
    """Return the Starlette app: the SDK's card and JSON-RPC routes, and /plain."""
    from a2a.server.context import ServerCallContext
    from a2a.server.request_handlers.request_handler import RequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        SendMessageRequest,
        Task,
        TaskState,
        TaskStatus,
        UnsupportedOperationError,
    )
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    class AtOnce(RequestHandler):
        """Answers message/send with a completed task; nothing else."""

        async def on_message_send(
            self, params: SendMessageRequest, context: ServerCallContext
        ) -> Task:
            return Task(
                id=params.message.message_id,
                context_id="floor",
                status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
            )

        async def _no(self, *args: Any, **kw: Any) -> Any:
            raise UnsupportedOperationError(message="not in this experiment")

        on_get_task = on_list_tasks = on_cancel_task = _no
        on_create_task_push_notification_config = _no
        on_get_task_push_notification_config = _no
        on_list_task_push_notification_configs = _no
        on_delete_task_push_notification_config = _no
        on_get_extended_agent_card = _no

        async def on_message_send_stream(self, *args: Any, **kw: Any) -> AsyncGenerator[Any]:
            raise UnsupportedOperationError(message="not in this experiment")
            yield  # pragma: no cover - makes this an async generator

        async def on_subscribe_to_task(self, *args: Any, **kw: Any) -> AsyncGenerator[Any]:
            raise UnsupportedOperationError(message="not in this experiment")
            yield  # pragma: no cover

    url = os.environ["A2A_FLOOR_URL"]
    card = AgentCard(
        name="floor",
        description="the a2a-sdk's own cost",
        version="1.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["application/json"],
        default_output_modes=["application/json"],
        skills=[AgentSkill(id="echo", name="echo", description="answered at once", tags=["x"])],
    )

    async def plain(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"id": body.get("id"), "state": "completed"})

    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            *create_jsonrpc_routes(AtOnce(), "/"),
            Route("/plain", plain, methods=["POST"]),
        ]
    )


def _serve(port: int, unix_path: str) -> None:
    """Serve the app on the TCP port and on a Unix socket, as the console serves its doors."""
    import uvicorn

    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # As the console's door does (console/home/server.py): a socket made with proto 0 is
    # not one asyncio sets TCP_NODELAY on, and Nagle then costs 40 ms a call.
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tcp.bind(("127.0.0.1", port))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    config = uvicorn.Config(_app(), log_level="warning", access_log=False)
    asyncio.run(uvicorn.Server(config).serve(sockets=[tcp, unix]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(unix_path: str) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "A2A_FLOOR_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.a2a_floor", "--serve", str(port), unix_path], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + ".well-known/agent-card.json", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the floor's server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def _measure(url: str, unix_path: str, n: int) -> dict[str, list[float]]:
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

    local = httpx.AsyncClient(timeout=30, transport=httpx.AsyncHTTPTransport(uds=unix_path))
    async with httpx.AsyncClient(timeout=30) as http, local:
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)

        async def a2a(i: int) -> float:
            part = Part()
            part.data.struct_value.update({"command": "echo", "params": {"text": str(i)}})
            message = Message(message_id=f"floor-{i}", role=Role.ROLE_USER, parts=[part])
            started = time.perf_counter()
            out = [item async for item in client.send_message(SendMessageRequest(message=message))]
            took = time.perf_counter() - started
            assert out[0].task.status.state == TaskState.TASK_STATE_COMPLETED, out
            return took

        async def plain(i: int, over: httpx.AsyncClient = http) -> float:
            body = {"id": i, "command": "echo", "params": {"text": str(i)}}
            started = time.perf_counter()
            answer = await over.post(url + "plain", json=body)
            took = time.perf_counter() - started
            assert answer.json()["state"] == "completed"
            return took

        from pathlib import Path

        from vox_mqtt.cli._home import HomeClient

        home = HomeClient(Path(unix_path))

        async def console_client(i: int) -> float:
            body = {"id": i, "command": "echo", "params": {"text": str(i)}}
            started = time.perf_counter()
            status, answer = await home.call("POST", "/plain", body)
            took = time.perf_counter() - started
            assert (status, answer["state"]) == (200, "completed"), answer
            return took

        for i in range(_WARM):
            await console_client(-1 - i)
            await plain(-1 - i, local)
            await plain(-1 - i)
            await a2a(-1 - i)
        took: dict[str, list[float]] = {"home": [], "unix": [], "plain": [], "a2a": []}
        for i in range(n):
            took["home"].append(await console_client(i))
            took["unix"].append(await plain(i, local))
            took["plain"].append(await plain(i))
            took["a2a"].append(await a2a(i))
    return took


def measure(n: int) -> dict[str, float]:
    """Return the medians (ms) of a plain POST on a Unix socket and on TCP and of an SDK
    message/send on TCP, the SDK's cost over the plain POST on TCP, and over the Unix one
    (what a door on the SDK pays over the console's own socket before any work)."""
    with tempfile.TemporaryDirectory() as tmp:
        unix_path = os.path.join(tmp, "floor.sock")
        with _server(unix_path) as url:
            took = asyncio.run(_measure(url, unix_path, n))
    ms = {name: statistics.median(values) * 1000 for name, values in took.items()}
    return {
        "sdk_floor_home_ms": round(ms["home"], 2),
        "sdk_floor_unix_ms": round(ms["unix"], 2),
        "sdk_floor_plain_ms": round(ms["plain"], 2),
        "sdk_floor_a2a_ms": round(ms["a2a"], 2),
        "sdk_floor_delta_ms": round(ms["a2a"] - ms["plain"], 2),
        "sdk_floor_over_unix_ms": round(ms["a2a"] - ms["unix"], 2),
        # Figure 19's own terms: an SDK door against the console's client on its socket.
        "sdk_floor_over_home_ms": round(ms["a2a"] - ms["home"], 2),
    }


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(int(sys.argv[2]), sys.argv[3])
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    found = measure(n)
    print(f"x{n}, interleaved, one run, no fleet and no console")
    print(f"the console's own client, Unix socket: median {found['sdk_floor_home_ms']:.2f} ms")
    print(f"plain JSON POST, Unix socket: median {found['sdk_floor_unix_ms']:.2f} ms")
    print(f"plain JSON POST, TCP: median {found['sdk_floor_plain_ms']:.2f} ms")
    print(f"a2a-sdk message/send, answered at once: median {found['sdk_floor_a2a_ms']:.2f} ms")
    print(f"the SDK's own cost per call: {found['sdk_floor_delta_ms']:+.2f} ms")
    print(f"an SDK door over a plain Unix-socket POST: {found['sdk_floor_over_unix_ms']:+.2f} ms")
    print(f"an SDK door over the console's client: {found['sdk_floor_over_home_ms']:+.2f} ms")


if __name__ == "__main__":
    main()
