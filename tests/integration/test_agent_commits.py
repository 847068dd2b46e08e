"""Which ledger rows commit together on the hot path (docs/ledger.md, rows that commit together)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.agentkit import Analyst, Slow, operator_config, start_agents, wait_for
from tests.kits.brokerkit import tree_fleet
from tests.kits.daemonkit import render
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.fleet.config import load_daemon_config

# These tests count the commits of one command. On a loaded machine an ack slower than the
# first re-send interval (0.3 s in agentkit) brings a re-sent copy, whose `duplicate` row is a
# commit of its own; and a child's heartbeat (1 s in agentkit) inside the counted window
# brings its master's witness row, another commit (a 0.2 s heartbeat made it 5, not 4, every
# time). Neither may happen while a command is counted.
NO_RESEND = {"resend_initial": 30.0, "heartbeat_interval": 30.0}


class Gate(Role):
    """A command that returns when the test opens its gate, not after a time load can stretch."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    @command
    async def hold(self) -> str:
        await self.opened.wait()
        return "released"


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet({"root": None, "coordinator": "root", "specialist_a": "coordinator"})


async def outbox_empties(agent: VOXAgent) -> None:
    """Wait until every message the agent sent was acknowledged and left its outbox."""
    async with asyncio.timeout(10):
        while await agent.memory.pending_outbox():  # noqa: ASYNC110 - the ledger is polled
            await asyncio.sleep(0.02)


def rows_about(rows: list[dict[str, Any]], message_id: UUID) -> list[tuple[int, str, str]]:
    """(id, action, type) of every row naming the message, as itself or as what it answers."""
    mid = str(message_id)
    return [
        (r["id"], r["action"], r["message_type"])
        for r in sorted(rows, key=lambda r: r["id"])
        if r["message_id"] == mid or r["reply_to"] == mid
    ]


async def commits_for_one_sleep(
    operator: VOXAgent, root: VOXAgent, seconds: float
) -> tuple[int, UUID]:
    """Warm up, then count the root's commits for one `sleep` (acks recorded too)."""
    await operator.request("sleep", {"seconds": 0}, to=root.id, timeout=10)
    await outbox_empties(root)
    before = root.memory.commit_count
    reply = await operator.request("sleep", {"seconds": seconds}, to=root.id, timeout=10)
    # The root is done once its result is recorded: that commit came before its publish.
    await outbox_empties(root)
    assert reply.reply_to is not None
    return root.memory.commit_count - before, reply.reply_to


async def root_and_operator(
    stack: AsyncExitStack, secure: Any, tmp_path: Path, roles: dict[str, Any], **options: Any
) -> tuple[VOXAgent, VOXAgent]:
    """Start the agents and an operator, none re-sending or beating while a command is counted."""
    agents = await start_agents(stack, secure, tmp_path, roles, **NO_RESEND, **options)
    operator = await stack.enter_async_context(
        VOXAgent(operator_config(secure, tmp_path, **NO_RESEND))
    )
    return agents["root"], operator


async def test_a_command_that_starts_at_once_costs_its_agent_two_commits(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root, operator = await root_and_operator(
            stack, secure, tmp_path, {"root": [Slow()]}, names=["root"]
        )
        commits, request = await commits_for_one_sleep(operator, root, 0)
        # received + ack sent + started; result sent + completed. Nothing acknowledges the
        # result (docs/messages.md): the third commit, its ack's received row, is gone.
        assert commits == 2
        rows = rows_about(await root.memory.get_recent(50), request)
        first = rows[0][0]
        assert rows[:3] == [
            (first, "received", "command_request"),
            (first + 1, "sent", "message_acknowledged"),
            (first + 2, "started", "command_request"),
        ]
        assert [(a, t) for _, a, t in rows[3:5]] == [
            ("sent", "command_result"),
            ("completed", "command_request"),
        ]
        assert rows[4][0] == rows[3][0] + 1


async def test_a_command_waiting_for_a_slot_is_started_only_when_it_runs(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root, operator = await root_and_operator(
            stack, secure, tmp_path, {"root": [Slow()]}, names=["root"], max_concurrency=1
        )
        first = asyncio.create_task(
            operator.request("sleep", {"seconds": 0.6}, to=root.id, timeout=10)
        )
        await wait_for(lambda: root.in_flight == 1)
        second = await operator.request("sleep", {"seconds": 0}, to=root.id, timeout=10)
        await first
        assert second.reply_to is not None
        rows = rows_about(await root.memory.get_recent(100), second.reply_to)
        actions = [a for _, a, _ in rows]
        assert actions[:2] == ["received", "sent"]  # the request, then its ack, together
        received, started = rows[0][0], next(i for i, a, _ in rows if a == "started")
        # It waited for the slot: its started row is a commit of its own, made later.
        assert started > received + 2


async def test_delegating_commits_the_delegated_row_with_the_downstream_request(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root, operator = await root_and_operator(
            stack, secure, tmp_path, {"specialist_a": [Analyst()]}
        )
        await wait_for(lambda: "analyze" in root.advertised_commands())
        reply = await operator.request("analyze", {"target": "x"}, to=root.id, timeout=10)
        assert reply.reply_to is not None
        rows = sorted(await root.memory.get_recent(100), key=lambda r: r["id"])
        delegated = next(
            r for r in rows if r["action"] == "delegated" and r["message_id"] == str(reply.reply_to)
        )
        downstream = next(r for r in rows if r["id"] == delegated["id"] - 1)
        assert (downstream["action"], downstream["message_type"]) == ("sent", "command_request")
        assert downstream["reply_to"] == str(reply.reply_to)
        assert delegated["outcome"] == downstream["target"]


async def test_a_relay_commits_once_on_the_way_down_and_once_on_the_way_up(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    gate = Gate()
    async with AsyncExitStack() as stack:
        root, operator = await root_and_operator(
            stack, secure, tmp_path, {"specialist_a": [gate, Slow()]}
        )
        await wait_for(lambda: "hold" in root.advertised_commands())
        await operator.request("sleep", {"seconds": 0}, to=root.id, timeout=10)
        await outbox_empties(root)
        before = root.memory.commit_count
        asked = asyncio.create_task(operator.request("hold", {}, to=root.id, timeout=20))
        # The gate stays shut until the child's ack has committed at the root, so the ack's
        # row commits alone whatever the load: a timed sleep let a slow root take the ack
        # and the result in one turn, and group commit rightly made them one.
        # received + ack sent + downstream sent + delegated; then the child's ack.
        await wait_for(lambda: root.memory.commit_count - before == 2)
        gate.opened.set()
        reply = await asked
        await outbox_empties(root)
        # ...then the child's result received + the reply sent + completed. Neither answer
        # is acknowledged (docs/messages.md): no ack sent for the child's, no ack received
        # for the root's.
        assert root.memory.commit_count - before == 3
        request = reply.reply_to
        assert request is not None
        recent = sorted(await root.memory.get_recent(50), key=lambda r: r["id"])
        rows = rows_about(recent, request)
        first = rows[0][0]
        assert rows[:4] == [
            (first, "received", "command_request"),
            (first + 1, "sent", "message_acknowledged"),
            (first + 2, "sent", "command_request"),
            (first + 3, "delegated", "command_request"),
        ]
        downstream = next(r["message_id"] for r in recent if r["id"] == first + 2)
        result = next(
            r
            for r in recent
            if (r["reply_to"], r["action"], r["message_type"])
            == (downstream, "received", "command_result")
        )
        up = [(r["action"], r["message_type"]) for r in recent if r["id"] >= result["id"]][:3]
        assert up == [
            ("received", "command_result"),
            ("sent", "command_result"),
            ("completed", "command_request"),
        ]


class Echo(Role):
    """An idempotent command answered at once, as the bench's figures 1 and 3 send."""

    @command(idempotent=True)
    async def echo(self, text: str) -> str:
        return text


async def messages_of(request: UUID, agents: list[VOXAgent]) -> list[tuple[str, str]]:
    """(type, the type it answers or acknowledges) of every message a command made.

    Counted from the ledgers: every message is recorded `sent` by its sender before its
    publish; a command's messages are its requests down the tree (each `reply_to` the one
    above), their answers and the acks, found by following `reply_to` from the request.
    """
    rows = [r for agent in agents for r in await agent.memory.get_recent(500)]
    sent = {r["message_id"]: r for r in rows if r["action"] == "sent"}
    found, ids = set(), {str(request)}
    while True:
        more = {mid for mid, r in sent.items() if r["reply_to"] in ids} - found
        if not more:
            break
        found |= more
        ids |= more
    found.add(str(request))
    return sorted(
        (sent[m]["message_type"], sent.get(sent[m]["reply_to"] or "", {}).get("message_type", ""))
        for m in found
    )


async def test_no_answer_is_acknowledged_on_a_three_level_command(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack, secure, tmp_path, {"specialist_a": [Echo()]}, **NO_RESEND
        )
        operator = await stack.enter_async_context(
            VOXAgent(operator_config(secure, tmp_path, **NO_RESEND))
        )
        root = agents["root"]
        await wait_for(lambda: "echo" in root.advertised_commands())
        reply = await operator.request("echo", {"text": "x"}, to=root.id, timeout=10)
        everyone = [operator, *agents.values()]
        for agent in everyone:
            await outbox_empties(agent)  # every request answered, nothing left to re-send
        assert reply.reply_to is not None
        messages = await messages_of(reply.reply_to, everyone)
        requests = [m for m in messages if m[0] == "command_request"]
        answers = [m for m in messages if m[0] == "command_result"]
        acks = [m for m in messages if m[0] == "message_acknowledged"]
        assert len(requests) == len(answers) == 3, messages
        # Only requests are acknowledged, never an answer (docs/messages.md): at most one
        # per level, none where a quick answer stood for it; 8 messages when the
        # specialist answered within QUICK_ANSWER_WINDOW, as it does unless loaded.
        assert all(answered == "command_request" for _, answered in acks), messages
        assert 2 <= len(acks) <= 3, messages


async def test_a_quick_hop_is_two_messages(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        root, operator = await root_and_operator(
            stack, secure, tmp_path, {"root": [Echo()]}, names=["root"]
        )
        await operator.request("echo", {"text": "warm"}, to=root.id, timeout=10)
        reply = await operator.request("echo", {"text": "x"}, to=root.id, timeout=10)
        await outbox_empties(operator)
        assert reply.reply_to is not None
        messages = await messages_of(reply.reply_to, [operator, root])
        kinds = [kind for kind, _ in messages]
        # The request and its answer, which stands for its ack; nothing acknowledges the
        # answer. A handler slower than QUICK_ANSWER_WINDOW (load) adds the request's ack.
        assert kinds in (
            ["command_request", "command_result"],
            ["command_request", "command_result", "message_acknowledged"],
        ), messages
        assert ("message_acknowledged", "command_result") not in messages


async def test_ledger_sync_reaches_the_agents_ledger(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack, secure, tmp_path, {}, names=["root"], ledger_sync="normal", **NO_RESEND
        )
        assert agents["root"].memory.sync == "normal"


def test_ledger_sync_is_read_from_the_daemon_config(tmp_path: Path) -> None:
    config = render(tmp_path)
    assert load_daemon_config(config).agent_config(config.parent).ledger_sync == "full"
    text = config.read_text()
    config.write_text(text.replace("[agent]\n", '[agent]\nledger_sync = "normal"\n', 1))
    assert load_daemon_config(config).agent_config(config.parent).ledger_sync == "normal"
