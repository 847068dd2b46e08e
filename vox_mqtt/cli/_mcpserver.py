"""The MCP server of `vox mcp` (cli/mcpdoor.py): a client of the operator's console.

It never logs in to MQTT itself: every tool asks the resident console over its Unix socket
(cli/_home.py), which is the operator, holds its one session, its ledger and its keys, and
is started on demand as for any verb (docs/operations.md, "The operator's console").
What it offers and what it does not (no decision on a job: seed 003) is in docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, Final

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ._home import ConsoleUnreachable, HomeClient, reach

__all__ = ["build_server", "progress_of", "status_summary"]

_WAIT_MAX: Final = 600.0  # seconds a send_command call may hold the client at most
_COMMAND_LIMIT: Final = 3600.0  # a request's deadline at most, as the CLI's --timeout allows
_ENDS: Final = ("answer", "failed", "detached", "pending", "refused")


def progress_of(details: dict[str, Any]) -> tuple[float | None, str | None]:
    """Return the fraction and text a progress transition carries, however deep it was nested.

    A request delegated down the tree reports its part one level down in `below`
    (docs/messages.md, "Lifecycle"): the deepest fraction and text are the handler's own.
    """
    fraction: float | None = None
    text: str | None = None
    level: Any = details
    for _ in range(32):  # a tree is not deeper than this; a loop of dicts is not possible
        if not isinstance(level, dict):
            break
        value = level.get("fraction")
        if isinstance(value, int | float) and not isinstance(value, bool):
            fraction = float(value)
        if isinstance(level.get("text"), str):
            text = level["text"]
        level = level.get("below")
    return fraction, text


def status_summary(document: dict[str, Any], root_id: str | None) -> dict[str, Any]:
    """Return `vox status --json`'s document as a summary: counts by status, then each agent."""
    agents = [a for a in document.get("agents", []) if isinstance(a, dict)]
    counts: dict[str, int] = {}
    for agent in agents:
        state = str(agent.get("status"))
        counts[state] = counts.get(state, 0) + 1
    keep = ("name", "id", "master_id", "status", "error_code", "in_flight", "incidents")
    return {
        "agents": len(agents),
        "by_status": dict(sorted(counts.items())),
        "root": next((a.get("name") for a in agents if a.get("id") == root_id), None),
        "list": [{k: a[k] for k in keep if k in a} for a in agents],
    }


def _root_commands(document: dict[str, Any], root_id: str | None) -> list[str]:
    for agent in document.get("agents", []):
        if isinstance(agent, dict) and agent.get("id") == root_id:
            return [str(c) for c in agent.get("commands") or []]
    return []


def build_server(config: Path) -> Any:
    """Return the MCPServer whose tools ask the console named by `config`."""
    server = MCPServer(
        "vox",
        instructions=(
            "A vox-mqtt fleet of hierarchical agents, reached through its operator's console. "
            "Call list_commands first; send_command runs one of the root's commands. "
            "Decisions on jobs are the person's alone and are not offered here."
        ),
    )

    async def client() -> HomeClient:
        try:
            return await reach(config)
        except (ConsoleUnreachable, OSError) as exc:
            raise ToolError(f"the operator's console: {exc}") from None

    async def ask(path: str, body: dict[str, Any]) -> dict[str, Any]:
        home = await client()
        try:
            status, found = await home.call("POST", path, body)
        except (ConsoleUnreachable, OSError, asyncio.IncompleteReadError) as exc:
            raise ToolError(f"the operator's console did not answer: {exc}") from None
        if status != 200 and "report" not in found:
            raise ToolError(str(found.get("error") or f"the console answered {status}"))
        return found

    async def document() -> tuple[dict[str, Any], str | None]:
        home = await client()
        hello = await home.hello() or {}
        found = await ask("/v1/status", {"json": True})
        doc = found.get("document")
        return (doc if isinstance(doc, dict) else {}), hello.get("root_id")

    @server.tool()
    async def fleet_status() -> dict[str, Any]:
        """The fleet's liveness as the operator sees it: counts by status, then each agent."""
        doc, root_id = await document()
        return status_summary(doc, root_id)

    @server.tool()
    async def list_commands() -> dict[str, Any]:
        """The commands the fleet's root accepts (send them with send_command).

        The root advertises command names only: parameters are passed as a JSON object
        named as the handler's keyword arguments (docs/mcp.md).
        """
        doc, root_id = await document()
        return {
            "commands": _root_commands(doc, root_id),
            "parameter_schemas": None,
            "note": "the root advertises names only; params are the handler's keyword arguments",
        }

    @server.tool()
    async def send_command(
        command: str,
        ctx: Context,
        params: dict[str, Any] | None = None,
        wait_s: float = 30.0,
        timeout_s: float = 300.0,
    ) -> dict[str, Any]:
        """Send one of the root's commands and wait up to wait_s seconds for its end.

        Progress reports come as progress notifications. The answer is the result, a
        failure with its VOX error code, or (when the wait ends first) the request id to
        ask request_status about: the request goes on, it is the operator's (timeout_s is
        its deadline through the tree).
        """
        wait = min(max(wait_s, 0.0), _WAIT_MAX)
        limit = min(max(timeout_s, 1.0), _COMMAND_LIMIT)
        home = await client()
        body = {
            "command": command,
            "params": params or {},
            "timeout": limit,
            "mode": "follow",
            "door": "mcp",
        }
        found: dict[str, Any] = {"command": command, "request_id": None}
        stream = home.stream("/v1/send", body)
        steps = 0
        ends = time.monotonic() + wait
        try:
            while True:
                left = ends - time.monotonic()
                if left <= 0:
                    break
                try:
                    line = await asyncio.wait_for(anext(stream), left)
                except TimeoutError:
                    break
                except StopAsyncIteration:
                    return found if "state" in found else {**found, "state": "unknown"}
                kind = line.get("kind")
                if kind == "request":
                    found["request_id"] = line.get("request_id")
                elif kind == "transition":
                    steps += 1
                    details = line.get("details") or {}
                    fraction, text = progress_of(details)
                    words = str(line.get("state"))
                    if text:
                        words += f": {text}"
                    if fraction is not None:
                        words += f" ({fraction:.0%})"
                    # MCP wants the progress value to grow: the count of transitions does.
                    await ctx.report_progress(steps, None, words)
                elif kind == "answer":
                    result = (line.get("details") or {}).get("result")
                    return {**found, "state": "completed", "result": result}
                elif kind in _ENDS:
                    state = "canceled" if line.get("code") == "CANCELED" else "failed"
                    return {
                        **found,
                        "state": state,
                        "code": line.get("code"),
                        "error": line.get("error"),
                    }
        except (ConsoleUnreachable, OSError, asyncio.IncompleteReadError) as exc:
            raise ToolError(f"the operator's console did not answer: {exc}") from None
        finally:
            # Hanging up leaves the request running: it is the console's (console/home/api.py).
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
        return {**found, "state": "running", "note": "ask request_status with the request id"}

    @server.tool()
    async def request_status(request_id: str, wait_s: float = 10.0) -> dict[str, Any]:
        """Where a request the operator sent stands, through the tree (id or 4+ digits of it)."""
        return await ask("/v1/request", {"request_id": request_id, "wait": min(wait_s, 60.0)})

    @server.tool()
    async def cancel_request(
        request_id: str, reason: str | None = None, wait_s: float = 10.0
    ) -> dict[str, Any]:
        """Cancel a request the operator sent; the report says whether the tree confirmed it."""
        body = {"request_id": request_id, "reason": reason, "wait": min(wait_s, 60.0)}
        return await ask("/v1/cancel", body)

    @server.tool()
    async def open_incidents() -> dict[str, Any]:
        """The war room's open incidents, as `vox warroom` lists them."""
        return await ask("/v1/warroom", {})

    return server
