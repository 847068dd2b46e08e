"""The MCP server of `vox mcp` (cli/mcpdoor.py): a client of the operator's console.

It never logs in to MQTT itself: every tool asks the resident console over its Unix socket
(cli/_home.py), which is the operator, holds its one session, its ledger and its keys, and
is started on demand as for any verb (docs/operations.md, "The operator's console").
What it offers and what it does not (no decision on a job: seed 003) is in docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from mcp.types import Tool as MCPTool

from ._home import ConsoleUnreachable, HomeClient, reach

__all__ = ["build_server", "command_tool", "progress_of", "status_summary", "tool_command"]

_WAIT_MAX: Final = 600.0  # seconds a send_command call may hold the client at most
_COMMAND_LIMIT: Final = 3600.0  # a request's deadline at most, as the CLI's --timeout allows
_ENDS: Final = ("answer", "failed", "detached", "pending", "refused")
# A root command is offered as its own tool, `cmd_<command>`, when the name fits what MCP
# clients take as a tool name (the strictest: letters, digits, _ and -, 64 at most).
_TOOL_PREFIX: Final = "cmd_"
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,60}")
_COMMAND_WAIT: Final = 30.0  # a command's own tool waits this long, as send_command's default
_COMMAND_DEADLINE: Final = 300.0  # and gives the request this deadline through the tree


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


def _root_commands(document: dict[str, Any], root_id: str | None) -> dict[str, dict[str, Any]]:
    """Return the root's commands -> what each takes ({"doc", "schema"}, {} when unknown)."""
    for agent in document.get("agents", []):
        if isinstance(agent, dict) and agent.get("id") == root_id:
            found = agent.get("params")
            params: dict[str, Any] = found if isinstance(found, dict) else {}
            return {str(c): dict(params.get(c) or {}) for c in agent.get("commands") or []}
    return {}


def tool_command(name: str) -> str | None:
    """Return the command a `cmd_<command>` tool runs, or None for another tool's name."""
    if not name.startswith(_TOOL_PREFIX):
        return None
    command = name[len(_TOOL_PREFIX) :]
    return command if _TOOL_NAME.fullmatch(command) else None


def command_tool(command: str, entry: dict[str, Any]) -> MCPTool | None:
    """Return the tool of one root command: its doc, and its handler's schema as input.

    None when the command's name is no tool name: send_command still sends it.
    """
    if not _TOOL_NAME.fullmatch(command):
        return None
    schema = entry.get("schema")
    doc = str(entry.get("doc") or f"The fleet's `{command}` command.")
    return MCPTool(
        name=_TOOL_PREFIX + command,
        description=(
            f"{doc}\n\nRuns the root's `{command}` command (as send_command with "
            f"wait_s={_COMMAND_WAIT:.0f}): the result, a failure with its VOX code, or the "
            "request id when it is still running."
        ),
        input_schema=schema if isinstance(schema, dict) else {"type": "object"},
    )


class _FleetServer(MCPServer):
    """The SDK's server, with one tool per root command listed beside the fixed ones."""

    def __init__(
        self,
        commands: Callable[[], Awaitable[dict[str, dict[str, Any]]]],
        run: Callable[[str, dict[str, Any], Any], Awaitable[dict[str, Any]]],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._commands = commands
        self._run = run

    async def list_tools(self) -> list[MCPTool]:
        fixed = await super().list_tools()
        taken = {tool.name for tool in fixed}
        try:
            commands = await self._commands()
        except (ToolError, ConsoleUnreachable, OSError, asyncio.IncompleteReadError):
            return fixed  # no console to ask: the fixed tools say so when called
        found = (command_tool(c, e) for c, e in sorted(commands.items()))
        return [*fixed, *(t for t in found if t is not None and t.name not in taken)]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        command = tool_command(name)
        if command is None or self._tool_manager.get_tool(name) is not None:
            return await super().call_tool(name, arguments, context)
        found = await self._run(command, arguments, context)
        text = json.dumps(found, default=str)
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=found
        )


def build_server(config: Path) -> Any:
    """Return the MCPServer whose tools ask the console named by `config`."""

    async def follow(
        command: str, params: dict[str, Any], wait: float, limit: float, ctx: Any
    ) -> dict[str, Any]:
        """Send a command through the console and follow it for `wait` seconds at most."""
        home = await client()
        body = {
            "command": command,
            "params": params,
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
                    if ctx is not None:
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

    async def commands() -> dict[str, dict[str, Any]]:
        doc, root_id = await document()
        return _root_commands(doc, root_id)

    async def run(command: str, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return await follow(command, params, _COMMAND_WAIT, _COMMAND_DEADLINE, ctx)

    server = _FleetServer(
        commands,
        run,
        name="vox",
        instructions=(
            "A vox-mqtt fleet of hierarchical agents, reached through its operator's console. "
            "Each of the root's commands is a tool cmd_<command> with its handler's parameters; "
            "list_commands lists them, send_command runs any of them. "
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
        """The commands the fleet's root accepts, each with its doc and parameters' schema.

        Send one with its own tool (cmd_<command>) or with send_command: params are a JSON
        object named as the handler's keyword arguments (docs/mcp.md).
        """
        found = await commands()
        return {
            "commands": sorted(found),
            "params": found,
            "note": "params: each command's doc and its handler's JSON schema, where known",
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
        return await follow(command, params or {}, wait, limit, ctx)

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
        body["door"] = "mcp"  # the operator's ledger says which door the cancel came through
        return await ask("/v1/cancel", body)

    @server.tool()
    async def open_incidents() -> dict[str, Any]:
        """The war room's open incidents, as `vox warroom` lists them."""
        return await ask("/v1/warroom", {})

    return server
