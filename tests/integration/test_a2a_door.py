"""`vox console serve --a2a` on real daemons, driven by the a2a-sdk's own client (docs/a2a.md).

operator -> root -> coordinator -> specialist (tests/kits/lifecyclekit.py). The door listens
on 0.0.0.0 with a bearer token (beyond loopback it must): the card is read (skills = the
root's commands, with the specialist's handlers' schemas), a command completes with its
result as an artifact, a streamed command shows its progress then completed, the same
message id sent twice is one task and one run of the handler, a long command is cancelled
(canceled once the handler saw it), tasks are got and listed, a call without the token gets
401, and the card follows the root's commands when the specialist stops and starts again.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

from tests.kits.fleetproc import REPO, FleetProcesses, child_env, serving_vox
from tests.kits.lifecyclekit import events, ledger_rows, lifecycle_fleet, route_up, until
from vox_mqtt.cli._home import reach, state_dir_of
from vox_mqtt.console.home.a2acard import SKILL_PARAMS

pytestmark = pytest.mark.slow

Fleet = tuple[FleetProcesses, Path]
TOKEN = "a2a-door-token-for-tests-0123456789"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with lifecycle_fleet(tmp_path_factory.mktemp("a2a-door")) as found:
        yield found


def door_rows(config: Path) -> list[dict[str, Any]]:
    """Return the door rows of the operator's ledger (console/doorlog.py), oldest first."""
    rows = ledger_rows(state_dir_of(config) / "logs.db")
    return [json.loads(r["details"]) for r in rows if r["event_type"] == "door"]


def doors(config: Path) -> dict[str, str]:
    """Return request id -> the door the operator's ledger says its command came through."""
    return {d["request_id"]: d["door"] for d in door_rows(config) if d.get("what") != "cancel"}


def message(message_id: str, *, data: dict[str, Any] | None = None, text: str = "") -> Message:
    part = Part(text=text) if data is None else Part()
    if data is not None:
        part.data.struct_value.update(data)
    return Message(message_id=message_id, role=Role.ROLE_USER, parts=[part])


def artifact_result(task: Task) -> Any:
    assert task.artifacts, task
    return MessageToDict(task.artifacts[0].parts[0].data)["result"]


def ran(events_file: Path, what: str, n: int) -> int:
    return sum(1 for kind, m, _ in events(events_file) if kind == what and m == n)


def test_a_bare_non_loopback_a2a_door_is_refused(fleet: Fleet) -> None:
    procs, _ = fleet
    done = subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", "console", "serve", "--config",
         str(procs.operator_config), "--a2a", "0.0.0.0:0"],
        capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "without --a2a-token-file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def test_an_a2a_client_sends_streams_cancels_and_lists(fleet: Fleet, tmp_path: Path) -> None:
    procs, events_file = fleet
    config = procs.operator_config
    for command in ("steps", "stuck", "echo"):
        await route_up(procs, command)
    token_file = tmp_path / "a2a.token"
    token_file.write_text(TOKEN)

    def ready(log: str) -> str | None:
        found = re.search(r"serving A2A at (http://\S+/) ", log)
        return None if found is None or "listening on" not in log else found.group(1)

    serve = ["console", "serve", "--config", str(config), "--a2a", "0.0.0.0:0",
             "--a2a-token-file", str(token_file)]  # fmt: skip
    with serving_vox(serve, tmp_path / "console.log", ready, "vox console serve") as (_, url):
        url = url.replace("0.0.0.0", "127.0.0.1")
        async with httpx.AsyncClient(timeout=120) as bare:
            refused = await bare.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
            assert refused.status_code == 401, refused.text
            card = await A2ACardResolver(bare, url).get_agent_card()
        assert {"echo", "steps", "stuck"} <= {skill.id for skill in card.skills}, card
        # Each skill carries its handler's parameters, carried up from the specialist: whole
        # in the card's data-only extension, in words in its description.
        (extension,) = card.capabilities.extensions
        assert extension.uri == SKILL_PARAMS, extension
        assert not extension.required, extension
        schemas = MessageToDict(extension.params)["skills"]
        assert schemas["stuck"] == {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        }, schemas
        assert schemas["echo"]["properties"]["text"]["type"] == "string", schemas
        skills = {skill.id: skill for skill in card.skills}
        assert skills["steps"].description.startswith("Report `count` steps of progress")
        assert "count (integer, required), pause (number, required)" in skills["steps"].description
        assert json.loads(skills["stuck"].examples[0]) == {
            "command": "stuck",
            "params": {"n": "..."},
        }
        assert "Lifecycle" not in json.dumps(MessageToDict(card))  # no role class rises
        assert card.capabilities.streaming
        assert "bearer" in card.security_schemes
        for interface in card.supported_interfaces:
            interface.url = interface.url.replace("0.0.0.0", "127.0.0.1")
        assert [i.protocol_binding for i in card.supported_interfaces] == ["JSONRPC", "HTTP+JSON"]

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=120, headers=headers) as http:
            blocking = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
            streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)

            async def send(client: Any, request: SendMessageRequest) -> list[Any]:
                return [item async for item in client.send_message(request)]

            # A command with its result as an artifact (the data part form).
            echo = SendMessageRequest(
                message=message("m-echo", data={"command": "echo", "params": {"text": "hi"}})
            )
            (answer,) = await send(blocking, echo)
            assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED, answer
            assert artifact_result(answer.task) == "hi"

            # The HTTP+JSON binding answers the same (the text form).
            rest = ClientFactory(
                ClientConfig(
                    streaming=False, httpx_client=http, supported_protocol_bindings=["HTTP+JSON"]
                )
            ).create(card)
            (by_rest,) = await send(
                rest, SendMessageRequest(message=message("m-rest", text="echo text=rest"))
            )
            assert artifact_result(by_rest.task) == "rest", by_rest
            assert (await rest.get_task(GetTaskRequest(id=answer.task.id))).id == answer.task.id

            # A streamed command: its progress, then completed (the text form).
            streamed = await send(
                streaming,
                SendMessageRequest(message=message("m-steps", text="steps count=3 pause=0.7")),
            )
            states = [
                item.status_update.status.state for item in streamed
                if item.HasField("status_update")
            ]  # fmt: skip
            worded = [
                item.status_update.status.message.parts[0].text for item in streamed
                if item.HasField("status_update") and item.status_update.status.message.parts
            ]  # fmt: skip
            assert states[-1] == TaskState.TASK_STATE_COMPLETED, states
            assert TaskState.TASK_STATE_WORKING in states, states
            assert any("step" in words for words in worded), worded
            steps_id = streamed[0].task.id

            # The same message id twice: one task, one run of the handler.
            stuck = SendMessageRequest(
                message=message("m-stuck", text="stuck n=9"),
                configuration=SendMessageConfiguration(return_immediately=True),
            )
            (first,) = await send(blocking, stuck)
            (again,) = await send(blocking, stuck)
            assert first.task.id == again.task.id
            await until(lambda: ran(events_file, "started", 9) == 1, "the handler to start", 60)
            got = await blocking.get_task(GetTaskRequest(id=first.task.id))
            assert got.status.state == TaskState.TASK_STATE_WORKING, got

            # A client re-subscribes to the task in flight: it sees it to its end.
            async def resubscribed() -> list[Any]:
                request = SubscribeToTaskRequest(id=first.task.id)
                return [item async for item in streaming.subscribe(request)]

            watching = asyncio.ensure_future(resubscribed())
            await asyncio.sleep(0.5)
            canceled = await blocking.cancel_task(CancelTaskRequest(id=first.task.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED, canceled
            await until(lambda: ran(events_file, "cancelled", 9) == 1, "the handler's cancel")
            seen = await asyncio.wait_for(watching, 60)
            assert seen[0].task.status.state == TaskState.TASK_STATE_WORKING, seen
            last = seen[-1].status_update.status
            assert last.state == TaskState.TASK_STATE_CANCELED, seen
            assert last.message.parts[0].text.startswith("CANCELED: "), seen
            assert ran(events_file, "started", 9) == 1

            # `vox send`'s way, through the console: listed from the operator's ledger too.
            home = await reach(config, start=False)
            body = {"command": "echo", "params": {"text": "cli"}, "timeout": 30}
            lines = [line async for line in home.stream("/v1/send", body)]
            cli_id = lines[0]["request_id"]
            assert lines[-1]["kind"] == "answer", lines

            listed = await blocking.list_tasks(ListTasksRequest(include_artifacts=True))
            ids = [task.id for task in listed.tasks]
            assert ids == [cli_id, first.task.id, steps_id, by_rest.task.id, answer.task.id], ids
            through = doors(config)
            assert [through.get(i) for i in ids] == ["cli", "a2a", "a2a", "a2a", "a2a"], through
            acts = [
                (d["request_id"], d["door"], d.get("what")) for d in door_rows(config)
            ]  # fmt: skip
            assert (first.task.id, "a2a", "cancel") in acts, acts  # the cancel's door too
            assert listed.tasks[0].status.state == TaskState.TASK_STATE_COMPLETED, listed
            assert not listed.tasks[0].artifacts  # the ledger keeps no answer
            assert MessageToDict(listed.tasks[4].artifacts[0].parts[0].data) == {"result": "hi"}
            done = await blocking.list_tasks(
                ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=1)
            )
            assert [task.id for task in done.tasks] == [cli_id], done
            assert done.next_page_token, done

            (unknown,) = await send(
                blocking, SendMessageRequest(message=message("m-nope", text="nope"))
            )
            assert unknown.task.status.state == TaskState.TASK_STATE_REJECTED, unknown
            assert unknown.task.status.message.parts[0].text.startswith("NO_ROUTE: ")

            nonsense = SendMessageRequest(message=message("m-bad", data={"what": 1}))
            with pytest.raises(Exception, match=r"skills: .*echo"):
                await send(blocking, nonsense)

        # The card follows the root's commands: the specialist stops, its skills leave the
        # card; it starts again, they come back with their schemas.
        async def skill_ids() -> set[str]:
            async with httpx.AsyncClient(timeout=30) as http:
                found = await A2ACardResolver(http, url).get_agent_card()
            return {skill.id for skill in found.skills}

        specialist = procs.agents["specialist"]
        specialist.stop()
        for _ in range(400):
            if "echo" not in await skill_ids():
                break
            await asyncio.sleep(0.05)
        assert not {"echo", "steps", "stuck"} & await skill_ids()
        specialist.start()
        for _ in range(1200):
            if {"echo", "steps", "stuck"} <= await skill_ids():
                break
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(timeout=30) as http:
            again = await A2ACardResolver(http, url).get_agent_card()
        assert {"echo", "steps", "stuck"} <= {skill.id for skill in again.skills}, again
        assert (
            MessageToDict(again.capabilities.extensions[0].params)["skills"]["stuck"]
            == (schemas["stuck"])
        )
    log = (tmp_path / "console.log").read_text()
    assert "Traceback" not in log, log
