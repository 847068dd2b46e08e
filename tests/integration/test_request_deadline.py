"""Deadlines are the caller's (issue 41, item 6): a level's request_timeout is only a default.

operator -> root -> coordinator -> specialist, in-process agents on a real broker, every
level's `request_timeout` 3 s. A request sent with a 600 s deadline to a handler that
blocks is still alive at every level after four of those timeouts (12 s: the small-timeout
equivalent of the issue's 60 s with the default 30 s), every level holding the deadline
the operator gave; a request that carries no deadline still ends at the levels' 3 s.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.kits.agentkit import start_tree_with_operator, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.agent.tracking import SentState
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_REQUEST,
    CommandRequest,
    ErrorCode,
    new_message,
)

THREE = {"root": None, "coordinator": "root", "specialist": "coordinator"}
LEVEL_TIMEOUT = 3.0  # every level's request_timeout, the operator's too
OUTLIVED = 4  # how many level timeouts the long request must outlive


class Worker(Role):
    """A handler that blocks; what happened to each run goes to `seen`."""

    seen: ClassVar[list[tuple[str, str]]] = []  # (event, tag)

    @command
    async def hold(self, tag: str, seconds: float = 60.0) -> str:
        Worker.seen.append(("started", tag))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            Worker.seen.append(("cancelled", tag))
            raise
        Worker.seen.append(("finished", tag))
        return tag


def events(kind: str, tag: str) -> list[str]:
    return [t for event, t in Worker.seen if (event, t) == (kind, tag)]


@pytest.fixture(autouse=True)
def fresh_witness() -> None:
    Worker.seen = []


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet(THREE)


async def start_short_tree(
    stack: AsyncExitStack, secure: Any, tmp_path: Path
) -> tuple[dict[str, VOXAgent], VOXAgent]:
    """The tree and its operator, every one with a request_timeout of LEVEL_TIMEOUT."""
    short = {"request_timeout": LEVEL_TIMEOUT}
    roles = {"specialist": [Worker()]}
    return await start_tree_with_operator(
        stack, secure, tmp_path, roles, ready="hold", operator=short, **short
    )


async def deadlines(agent: VOXAgent, action: str) -> list[str | None]:
    """The deadlines of the command_requests an agent recorded under an action."""
    found = []
    for row in await agent.memory.get_recent(2000):
        if row["action"] == action and row["message_type"] == MSG_COMMAND_REQUEST:
            details = row["details"]
            details = json.loads(details) if isinstance(details, str) else details
            found.append(details.get("deadline"))
    return found


async def test_a_long_deadline_outlives_every_levels_request_timeout(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents, operator = await start_short_tree(stack, secure, tmp_path)
        asked = asyncio.ensure_future(
            operator.request(
                "hold", {"tag": "long", "seconds": 3600}, to=fleet.root.id, timeout=600
            )
        )
        await wait_for(lambda: events("started", "long"), timeout=10)
        await asyncio.sleep(OUTLIVED * LEVEL_TIMEOUT)
        assert not asked.done(), asked.exception() if asked.done() else None
        assert not events("cancelled", "long")
        (pending,) = [
            t for t in operator.tracker.pending() if t.message.type == MSG_COMMAND_REQUEST
        ]
        report = await operator.request_status(pending.message_id, timeout=5)
        states = (report["state"], report["below"]["state"], report["below"]["below"]["state"])
        assert states == ("delegated", "delegated", "working")
        # The deadline the operator gave is the one every level received and passed down.
        (given,) = await deadlines(operator, "sent")
        assert given is not None
        for name in ("root", "coordinator", "specialist"):
            assert await deadlines(agents[name], "received") == [given], name
        for name in ("root", "coordinator"):
            assert await deadlines(agents[name], "sent") == [given], name
        # Ended by its caller, not by any level's timeout.
        await operator.cancel(pending.message_id, reason="done", timeout=10)
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(asked, 10)
        assert failed.value.code == ErrorCode.CANCELED


async def test_a_request_without_a_deadline_ends_at_the_levels_request_timeout(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        _, operator = await start_short_tree(stack, secure, tmp_path)
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=operator.config.id,
            target=fleet.root.id,
            details=CommandRequest(command="hold", params={"tag": "none", "seconds": 3600}),
        )
        tracked = await operator.send_message(request, expects_reply=True)
        # The operator waits on (no limit of its own here): the levels' default ends it.
        await asyncio.wait_for(tracked.done.wait(), 60)
        assert tracked.state is SentState.FAILED
        assert tracked.error_code == ErrorCode.TIMEOUT
        await wait_for(lambda: events("cancelled", "none"), timeout=10)
        assert not events("finished", "none")
