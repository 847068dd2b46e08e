"""`vox mcp` on real daemons, driven by the MCP SDK's own stdio client (docs/mcp.md).

operator -> root -> coordinator -> specialist (tests/kits/lifecyclekit.py), one `vox console
serve` as the operator, and `vox mcp` as its client: the tools are listed with their
schemas (one tool per root command, with its handler's, carried up the tree), the status
and the root's commands read, a command sent through its own tool and with send_command
(progress notifications and result), a long one left running then cancelled (the
specialist's handler saw the cancel), and no tool decides a job nor asks the person for anything.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, serving_vox
from tests.kits.lifecyclekit import event_at, ledger_rows, lifecycle_fleet, route_up, until
from vox_mqtt.cli._home import state_dir_of

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]
TOOLS = {
    "fleet_status", "list_commands", "send_command", "request_status", "cancel_request",
    "open_incidents",
}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("mcp-door")) as found:
        yield found


def client_env() -> dict[str, str]:
    env = child_env()
    env.pop("VOX_CONSOLE", None)  # through the console, as any client of it
    return env


def doors(config: Path) -> dict[str, str]:
    """Return request id -> the door the operator's ledger says it came through."""
    rows = ledger_rows(state_dir_of(config) / "logs.db")
    found = [json.loads(r["details"]) for r in rows if r["event_type"] == "door"]
    return {d["request_id"]: d["door"] for d in found}


def structured(result: Any) -> dict[str, Any]:
    assert isinstance(result, types.CallToolResult), result
    assert not result.is_error, result.content
    found = result.structured_content
    assert isinstance(found, dict), result
    return found


async def test_an_mcp_client_reads_sends_follows_and_cancels(fleet: Fleet, tmp_path: Path) -> None:
    procs, events_file = fleet
    config = procs.operator_config
    for command in ("steps", "stuck"):
        await route_up(procs, command)

    def ready(log: str) -> str | None:
        return "up" if "listening on" in log else None

    serve = ["console", "serve", "--config", str(config)]
    asked: list[Any] = []

    async def elicitation(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params)  # no tool of this door may ask: seed 003, docs/mcp.md
        return types.ElicitResult(action="decline")

    with serving_vox(serve, tmp_path / "console.log", ready, "vox console serve"):
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "vox_mqtt.cli", "mcp", "--config", str(config)],
            env=client_env(),
            cwd=REPO,
        )
        with (tmp_path / "mcp.err").open("w") as errlog:
            async with (
                stdio_client(server, errlog=errlog) as (read, write),
                ClientSession(read, write, elicitation_callback=elicitation) as session,
            ):
                await session.initialize()
                listed = await session.list_tools()
                tools = {tool.name: tool for tool in listed.tools}
                # The fixed tools, and one per root command with its handler's schema,
                # carried up from the specialist through the coordinator and the root.
                assert TOOLS | {"cmd_echo", "cmd_steps", "cmd_stuck"} <= set(tools), sorted(tools)
                assert tools["cmd_steps"].input_schema == {
                    "type": "object",
                    "properties": {"count": {"type": "integer"}, "pause": {"type": "number"}},
                    "required": ["count", "pause"],
                    "additionalProperties": False,
                }, tools["cmd_steps"]
                echo_schema = tools["cmd_echo"].input_schema
                assert echo_schema["properties"] == {"text": {"type": "string", "default": ""}}
                assert "required" not in echo_schema, echo_schema
                assert (tools["cmd_echo"].description or "").startswith(
                    "Answer the text it is given."
                ), tools["cmd_echo"]
                assert "second paragraph" not in (tools["cmd_echo"].description or "")
                assert "Lifecycle" not in json.dumps(listed.model_dump(mode="json"))
                schema = tools["send_command"].input_schema
                assert schema["required"] == ["command"], schema
                assert {"command", "params", "wait_s", "timeout_s"} <= set(schema["properties"])
                assert not [n for n in tools if "decide" in n or "approve" in n]

                status = structured(await session.call_tool("fleet_status", {}))
                assert status["root"] == "root", status
                assert status["by_status"].get("ACTIVE") == 3, status

                commands = structured(await session.call_tool("list_commands", {}))
                assert {"steps", "stuck", "echo"} <= set(commands["commands"]), commands
                assert commands["params"]["stuck"]["schema"]["required"] == ["n"], commands

                # A command through its own tool: its params are the tool's arguments.
                echoed = structured(await session.call_tool("cmd_echo", {"text": "own tool"}))
                assert (echoed["state"], echoed["result"]) == ("completed", "own tool"), echoed
                assert doors(config)[echoed["request_id"]] == "mcp"
                wrong = structured(await session.call_tool("cmd_stuck", {"n": "many"}))
                assert (wrong["state"], wrong["code"]) == ("failed", "INVALID_PARAMS"), wrong

                seen: list[tuple[float, str | None]] = []

                async def progress(
                    progress: float, total: float | None, message: str | None
                ) -> None:
                    seen.append((progress, message))

                sent = structured(
                    await session.call_tool(
                        "send_command",
                        {"command": "steps", "params": {"count": 4, "pause": 0.7}, "wait_s": 120},
                        progress_callback=progress,
                    )
                )
                assert (sent["state"], sent["result"]) == ("completed", 4), sent
                assert any(text and "step " in text for _, text in seen), seen  # some coalesce
                values = [value for value, _ in seen]
                assert values == sorted(set(values)), seen

                bad = structured(await session.call_tool("send_command", {"command": "nope"}))
                assert bad["state"] == "failed", bad
                assert bad["code"], bad

                long = structured(
                    await session.call_tool(
                        "send_command",
                        {"command": "stuck", "params": {"n": 7}, "wait_s": 2, "timeout_s": 600},
                    )
                )
                assert long["state"] == "running", long
                request_id = long["request_id"]
                assert doors(config)[request_id] == "mcp"
                await until(lambda: event_at(events_file, "started", 7), "the handler to start")
                canceled = structured(
                    await session.call_tool(
                        "cancel_request", {"request_id": request_id[:8], "reason": "enough"}
                    )
                )
                assert canceled["request_id"] == request_id, canceled
                await until(lambda: event_at(events_file, "cancelled", 7), "the handler's cancel")

                async def state() -> str:
                    found = structured(
                        await session.call_tool("request_status", {"request_id": request_id})
                    )
                    return str(found["report"].get("state"))

                for _ in range(100):
                    if await state() == "canceled":
                        break
                assert await state() == "canceled"
                # Every door is audited: the command and its cancel came through this one.
                found = structured(
                    await session.call_tool("request_status", {"request_id": request_id})
                )
                assert found["door"] == "mcp", found
                assert [(d["door"], d["what"]) for d in found["doors"]] == [
                    ("mcp", "command"),
                    ("mcp", "cancel"),
                ], found

                incidents = structured(await session.call_tool("open_incidents", {}))
                assert isinstance(incidents["rows"], list), incidents
        assert asked == [], asked
    assert "Traceback" not in (tmp_path / "mcp.err").read_text()
