"""A request's life through the tree, in-process agents on a real broker (docs/messages.md).

operator -> root -> coordinator -> specialist: cancel a running, a queued and a not yet
delivered request; ask where a request stands; follow its progress. Every level records
what it did in its own ledger, and no level learns of an agent below its children.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID, uuid4

import pytest

from tests.kits.agentkit import (
    agent_config,
    operator_config,
    start_agents,
    start_tree_with_operator,
    wait_for,
)
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent import lifecycle
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.progress import PROGRESS_INTERVAL
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed, VoxError
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST, MSG_STATUS_QUERY
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_REQUEST,
    ErrorCode,
    VOXMessage,
    new_message,
    serialize,
)
from vox_mqtt.protocol.settings import AgentConfig

THREE = {"root": None, "coordinator": "root", "specialist": "coordinator"}


class Worker(Role):
    """Long-running and chatty commands; what happened to each run goes to `seen`."""

    seen: ClassVar[list[tuple[str, str, float]]] = []  # (event, tag, time.monotonic())

    @command
    async def hold(self, tag: str, seconds: float = 60.0) -> str:
        Worker.seen.append(("started", tag, time.monotonic()))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            Worker.seen.append(("cancelled", tag, time.monotonic()))
            raise
        Worker.seen.append(("finished", tag, time.monotonic()))
        return tag

    @command
    async def spin(self, seconds: float) -> int:
        # A tight loop of reports: the rate bound, not the handler, limits what leaves.
        reports, start = 0, time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            reports += 1
            await self.agent.progress(min(1.0, elapsed / seconds), f"report {reports}")
            await asyncio.sleep(0.001)
        return reports


class Stubborn(Role):
    """A handler that runs on past its cancel until the test opens its gate."""

    gate: ClassVar[asyncio.Event | None] = None

    @command
    async def stubborn(self, tag: str) -> str:
        Worker.seen.append(("started", tag, time.monotonic()))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            Worker.seen.append(("cancelled", tag, time.monotonic()))  # and it goes on
        assert Stubborn.gate is not None
        await Stubborn.gate.wait()
        Worker.seen.append(("finished", tag, time.monotonic()))
        return tag


def events(kind: str, tag: str) -> list[float]:
    return [at for event, t, at in Worker.seen if event == kind and t == tag]


@pytest.fixture(autouse=True)
def fresh_witness() -> None:
    Worker.seen = []


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    return tree_fleet(THREE)


async def start_tree(
    stack: AsyncExitStack, secure: Any, tmp_path: Path, **overrides: Any
) -> tuple[dict[str, VOXAgent], VOXAgent]:
    roles = {"specialist": [Worker()]}
    return await start_tree_with_operator(stack, secure, tmp_path, roles, ready="hold", **overrides)


def sent_request(agent: VOXAgent) -> UUID:
    """The id of the one command_request an agent has in flight."""
    pending = [t for t in agent.tracker.pending() if t.message.type == MSG_COMMAND_REQUEST]
    assert len(pending) == 1, pending
    return pending[0].message_id


async def rows(agent: VOXAgent, action: str) -> list[dict[str, Any]]:
    return [r for r in await agent.memory.get_recent(2000) if r["action"] == action]


async def canceled_commands(agent: VOXAgent) -> list[dict[str, Any]]:
    return [r for r in await rows(agent, "canceled") if r["message_type"] == MSG_COMMAND_REQUEST]


async def test_a_running_handler_is_cancelled_through_three_levels_and_nothing_runs_again(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path)
        asked = asyncio.ensure_future(
            operator.request("hold", {"tag": "a"}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: events("started", "a"))
        request_id = sent_request(operator)
        began = time.monotonic()
        report = await operator.cancel(request_id, reason="stuck", timeout=10)
        assert report["request_id"] == str(request_id)
        assert report["state"] == "canceled"
        await wait_for(lambda: events("cancelled", "a"), timeout=5)
        assert events("cancelled", "a")[0] - began < 2.0
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(asyncio.shield(asked), 10)
        assert failed.value.code == ErrorCode.CANCELED
        assert failed.value.error == "canceled by its master: stuck"
        # Every level records its own part canceled (its request as it received it).
        for name in ("root", "coordinator", "specialist"):
            await wait_for_rows(agents[name], 1)
        assert not events("finished", "a")
    # Every agent restarts: nothing runs again and nothing is re-sent down.
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path)
        await asyncio.sleep(2.0)
        assert len(events("started", "a")) == 1
        for agent in agents.values():
            (canceled,) = await canceled_commands(agent)
            started = await rows(agent, "started")
            assert all(r["id"] < canceled["id"] for r in started)
            assert agent.in_flight == 0
        assert len(await rows(agents["specialist"], "started")) == 1


async def test_a_handler_that_outlives_its_cancel_keeps_it_canceling_until_it_ends(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "CANCEL_GRACE", 0.5)  # the cut handler's grace
    Stubborn.gate = asyncio.Event()
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        roles = {"specialist": [Stubborn()]}
        _, operator = await start_tree_with_operator(
            stack, secure, tmp_path, roles, ready="stubborn"
        )
        asked = asyncio.ensure_future(
            operator.request("stubborn", {"tag": "s"}, to=fleet.root.id, timeout=60)
        )
        await wait_for(lambda: events("started", "s"))
        request_id = sent_request(operator)
        report = await operator.cancel(request_id, reason="stop", timeout=3)
        # Its handler saw the cancel and runs on: never told canceled (docs/messages.md).
        assert (report["state"], report["level"]) == ("canceling", 3), report
        assert (
            "level 3 has not confirmed (canceling: its handler has not ended yet)"
            in (report["line"])
        ), report
        assert events("cancelled", "s")
        assert not events("finished", "s")
        # Nor is the operator answered CANCELED while it runs: not by the specialist's
        # answer, relayed up, nor by a replay of it to a re-sent request (one re-send at
        # least: RESEND_MAX apart once acknowledged).
        await asyncio.sleep(RESEND_MAX + 1.0)
        assert not asked.done()

        Stubborn.gate.set()
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(asyncio.shield(asked), 10)
        assert failed.value.code == ErrorCode.CANCELED
        await wait_for(lambda: events("finished", "s"))
        again = await operator.cancel(request_id, timeout=10)
        assert again["state"] == "canceled", again
        assert [level["state"] for level in nested_levels(again["levels"])] == ["canceled"] * 3
        assert "its handler had started at level 3 before the cancel came" in again["line"]


RESEND_MAX = AgentConfig.resend_max  # its default: the test trees keep it


def nested_levels(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each level's part of a nested report, the top one first."""
    found = []
    part: Any = report
    while isinstance(part, dict):
        found.append(part)
        part = part.get("below")
    return found


async def wait_for_rows(agent: VOXAgent, count: int) -> None:
    async with asyncio.timeout(10):
        while len(await canceled_commands(agent)) < count:  # noqa: ASYNC110 - the ledger is polled
            await asyncio.sleep(0.05)


async def test_a_queued_request_never_starts(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path, max_concurrency=1)
        spec = agents["specialist"]
        first = asyncio.ensure_future(
            operator.request("hold", {"tag": "first"}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: events("started", "first"))
        first_id = sent_request(operator)
        second = asyncio.ensure_future(
            operator.request("hold", {"tag": "second"}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: spec.requests.in_flight == 2)
        second_id = next(
            t.message_id for t in operator.tracker.pending() if t.message_id != first_id
        )
        report = await operator.cancel(second_id, timeout=10)
        assert report["state"] == "canceled"
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(asyncio.shield(second), 10)
        assert failed.value.code == ErrorCode.CANCELED
        # The running one runs on; the queued one never started, even once the slot frees.
        assert not events("cancelled", "first")
        await operator.cancel(first_id, timeout=10)
        with pytest.raises(CommandFailed):
            await asyncio.wait_for(asyncio.shield(first), 10)
        await asyncio.sleep(1.0)
        assert events("started", "second") == []
        assert len(await canceled_commands(spec)) == 2


async def test_a_cancel_that_comes_first_wins_across_a_restart(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = tree_fleet({"root": None, "specialist": "root"})
    secure = secure_broker_factory(fleet)
    spec_id = fleet.agent("specialist").id

    def specialist() -> VOXAgent:
        return VOXAgent(agent_config(secure, "specialist", tmp_path), [Worker()])

    def request_to(root: VOXAgent, tag: str) -> VOXMessage:
        return new_message(
            MSG_COMMAND_REQUEST,
            source=root.id,
            target=spec_id,
            details={"command": "hold", "params": {"tag": tag}},
        )

    async def cancel_first(root: VOXAgent, request: VOXMessage) -> None:
        cancel = new_message(
            MSG_CANCEL_REQUEST,
            source=root.id,
            target=spec_id,
            details={"request_id": str(request.message_id)},
        )
        tracked = await root.send_message(cancel, expects_reply=True)
        async with asyncio.timeout(10):
            await tracked.done.wait()
        assert tracked.reply is not None
        assert tracked.reply.details["state"] == "unknown"

    async with AsyncExitStack() as stack:
        await stack.enter_async_context(specialist())
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        early = request_to(root, "early")
        await cancel_first(root, early)
        with pytest.raises(CommandFailed) as failed:
            await root._outbox.await_reply(early, 10)
        assert failed.value.code == ErrorCode.CANCELED
        # A cancel remembered before a restart still wins after it.
        later = request_to(root, "later")
        await cancel_first(root, later)
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(specialist())
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        with pytest.raises(CommandFailed) as failed:
            await root._outbox.await_reply(later, 10)
        assert failed.value.code == ErrorCode.CANCELED
        assert {r["message_id"] for r in await canceled_commands(spec)} == {
            str(early.message_id),
            str(later.message_id),
        }
    assert Worker.seen == []


async def test_a_cancel_for_an_offline_child_is_delivered_when_it_is_back(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = tree_fleet({"root": None, "specialist": "root"})
    secure = secure_broker_factory(fleet)
    spec_id = fleet.agent("specialist").id
    async with AsyncExitStack() as stack:
        root = await stack.enter_async_context(
            VOXAgent(agent_config(secure, "root", tmp_path, request_timeout=30))
        )
        asked = asyncio.ensure_future(root.request("hold", {"tag": "off"}, to=spec_id, timeout=30))
        await wait_for(lambda: root.tracker.pending())
        request_id = sent_request(root)
        cancel = asyncio.ensure_future(root.cancel(request_id, reason="not needed", timeout=20))
        await asyncio.sleep(1.0)
        assert not cancel.done()
        spec = await stack.enter_async_context(
            VOXAgent(agent_config(secure, "specialist", tmp_path), [Worker()])
        )
        report = await asyncio.wait_for(cancel, 20)
        assert report["state"] in {"canceled", "unknown"}
        with pytest.raises(CommandFailed) as failed:
            await asyncio.wait_for(asyncio.shield(asked), 20)
        assert failed.value.code == ErrorCode.CANCELED, failed.value
        # Whichever came first, the handler never ran on past the cancel.
        await asyncio.sleep(0.5)
        assert len(events("started", "off")) == len(events("cancelled", "off"))
        assert len(await canceled_commands(spec)) == 1


async def test_status_nests_through_three_levels_naming_no_one_below(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    coord_id, spec_id = fleet.agent("coordinator").id, fleet.agent("specialist").id
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path)
        asked = asyncio.ensure_future(
            operator.request("hold", {"tag": "s", "seconds": 3.0}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: events("started", "s"))
        request_id = sent_request(operator)
        report = await operator.request_status(request_id, timeout=5)
        assert report["request_id"] == str(request_id)
        assert report["state"] == "delegated"
        assert report["below"]["state"] == "delegated"
        assert report["below"]["below"]["state"] == "working"
        assert "below" not in report["below"]["below"]
        assert [h["state"] for h in report["history"]] == ["received", "delegated"]
        assert [h["state"] for h in report["below"]["below"]["history"]] == [
            "received",
            "working",
        ]
        await asyncio.wait_for(asked, 10)
        # Finished: answered from the ledgers, still nested.
        done = await operator.request_status(request_id, timeout=5)
        assert (done["state"], done["below"]["state"], done["below"]["below"]["state"]) == (
            "completed",
            "completed",
            "completed",
        )
        # What the root received, and its whole ledger, never name the specialist; the
        # operator's never name the coordinator nor the specialist.
        root_rows = json.dumps(await agents["root"].memory.get_recent(5000))
        assert str(spec_id) not in root_rows
        operator_rows = json.dumps(await operator.memory.get_recent(5000))
        assert str(spec_id) not in operator_rows
        assert str(coord_id) not in operator_rows
        assert str(spec_id) not in json.dumps(done)
        assert str(coord_id) not in json.dumps(done)
        # A request the root never received: one clear state, to a query and to a cancel.
        unknown = await operator.request_status(uuid4(), timeout=5)
        assert unknown["state"] == "unknown"
        assert "below" not in unknown
        canceled = await operator.cancel(uuid4(), timeout=5)
        assert canceled["state"] == "unknown"


async def test_status_after_every_agent_restarted_comes_from_the_ledgers(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        _, operator = await start_tree(stack, secure, tmp_path)
        reply = await operator.request(
            "hold", {"tag": "r", "seconds": 0.2}, to=fleet.root.id, timeout=10
        )
        assert reply.details["result"] == "r"
        request_id = reply.reply_to
        assert request_id is not None
        before = await operator.request_status(request_id, timeout=5)
    async with AsyncExitStack() as stack:
        # The operator too: its tracker is empty, its ledger says where the request went.
        _, operator = await start_tree(stack, secure, tmp_path)
        after = await operator.request_status(request_id, timeout=5)
        # A finished request is not touched by a cancel: the report gives its end.
        report = await operator.cancel(request_id, timeout=5)
        assert report["state"] == "completed"
        assert (await operator.request_status(request_id, timeout=5))["state"] == "completed"
    assert after == before
    assert [after["state"], after["below"]["state"], after["below"]["below"]["state"]] == [
        "completed"
    ] * 3
    assert [h["state"] for h in after["below"]["below"]["history"]] == [
        "received",
        "working",
        "completed",
    ]


async def test_progress_climbs_in_order_within_its_rate_bound(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    seconds = 3.0
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path)
        asked = asyncio.ensure_future(
            operator.request("spin", {"seconds": seconds}, to=fleet.root.id, timeout=30)
        )
        await wait_for(lambda: operator.tracker.pending())
        request_id = sent_request(operator)
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(20):
            async for event in operator.follow(request_id):
                seen.append(event)
        reply = await asyncio.wait_for(asked, 10)
        reports = reply.details["result"]
        with pytest.raises(VoxError, match="call it from a command handler"):
            await operator.progress(0.5, "not in a handler")
        states = [e["state"] for e in seen]
        assert states[0] == "sent"
        assert states[-1] == "completed"
        assert "acknowledged" in states
        progress = [e["details"] for e in seen if e["state"] == "progress"]
        # Each level passes at most one report per interval up (plus the state changes).
        bound = seconds / PROGRESS_INTERVAL + 4
        assert 2 <= len(progress) <= bound, (len(progress), reports)
        assert reports > 10 * len(progress)  # the handler reported far more than left
        fractions = [p["below"]["below"]["fraction"] for p in progress if _deep(p)]
        assert fractions == sorted(fractions)
        assert fractions
        times = [e["at"] for e in seen]
        assert times == sorted(times)
        assert agents["specialist"].metrics.progress_dropped > 0
        # Nothing below the root's part names an agent.
        assert str(fleet.agent("specialist").id) not in json.dumps(seen)
        received = [
            r
            for r in await agents["root"].memory.get_recent(5000)
            if r["message_type"] == "command_progress" and r["action"] == "received"
        ]
        assert len(received) <= bound


def _deep(part: dict[str, Any]) -> bool:
    below = part.get("below") or {}
    return "fraction" in (below.get("below") or {})


async def test_a_childs_cancel_or_status_query_is_rejected_and_recorded(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {"specialist": [Worker()]})
        root, coord = agents["root"], agents["coordinator"]
        for kind in (MSG_CANCEL_REQUEST, MSG_STATUS_QUERY):
            message = new_message(
                kind, source=coord.id, target=root.id, details={"request_id": str(uuid4())}
            )
            await coord.send_message(message, expects_reply=False)

        async def refused() -> list[dict[str, Any]]:
            return [
                r
                for r in await rows(root, "rejected")
                if r["message_type"] in (MSG_CANCEL_REQUEST, MSG_STATUS_QUERY)
            ]

        async with asyncio.timeout(10):
            while len(await refused()) < 2:  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        for row in await refused():
            assert row["outcome"] == ErrorCode.UNAUTHORIZED_SOURCE
            assert "only this agent's master may send it" in row["reason"]


async def test_a_flood_of_status_queries_is_bounded_and_the_agent_keeps_serving(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        lower = AsyncExitStack()
        await start_agents(
            lower, secure, tmp_path, {"specialist": [Worker()]}, names=["specialist", "coordinator"]
        )
        root = await stack.enter_async_context(VOXAgent(agent_config(secure, "root", tmp_path)))
        await wait_for(lambda: "hold" in root.advertised_commands())
        operator = await stack.enter_async_context(VOXAgent(operator_config(secure, tmp_path)))
        reply = await operator.request(
            "hold", {"tag": "f", "seconds": 0.1}, to=fleet.root.id, timeout=10
        )
        request_id = reply.reply_to
        await lower.aclose()  # the levels below are gone: each query waits for them in vain

        async def query() -> VOXMessage:
            details = {"request_id": str(request_id), "within": 2.0}
            return await operator.ask(MSG_STATUS_QUERY, details, to=fleet.root.id, timeout=10)

        flood = 24
        began = time.monotonic()
        answers = await asyncio.gather(*(query() for _ in range(flood)), return_exceptions=True)
        busy = [a for a in answers if isinstance(a, CommandFailed) and a.code == ErrorCode.BUSY]
        reports = [a for a in answers if isinstance(a, VOXMessage)]
        assert len(busy) + len(reports) == flood, answers
        assert 1 <= len(reports) <= 8 + 2  # at most MAX_STATUS_QUERIES at once (+ stragglers)
        assert busy
        for report in reports:
            assert report.details["state"] == "completed"
            assert report.details["below"]["state"] == "unreachable"
        assert time.monotonic() - began < 8
        # Still serving: the next query is answered.
        again = await query()
        assert again.details["state"] == "completed"


async def test_a_malformed_progress_is_rejected_with_its_reason(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    from tests.kits.attackerkit import raw_envelope

    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {"specialist": [Worker()]})
        coord, spec = agents["coordinator"], agents["specialist"]
        raw = raw_envelope(
            "command_progress",
            spec.id,
            coord.id,
            {"state": "finished", "seq": 0},
            reply_to=str(uuid4()),
        )
        await spec._session.publish(topics.inbox(coord.id, spec.id), raw)

        async def refused() -> list[dict[str, Any]]:
            return [
                r
                for r in await rows(coord, "rejected")
                if "command_progress" in (r["reason"] or "")
            ]

        async with asyncio.timeout(10):
            while not await refused():  # noqa: ASYNC110 - the ledger is polled
                await asyncio.sleep(0.05)
        (row,) = await refused()
        assert "details.state" in row["reason"]
        assert "details.seq" in row["reason"]


async def test_a_deadline_given_up_on_is_a_cancel_for_the_child(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents, operator = await start_tree(stack, secure, tmp_path)
        with pytest.raises(CommandFailed) as failed:
            await operator.request("hold", {"tag": "d"}, to=fleet.root.id, timeout=1.5)
        assert failed.value.code == ErrorCode.TIMEOUT
        coord = agents["coordinator"]

        async def cancels(agent: VOXAgent, action: str) -> list[dict[str, Any]]:
            return [r for r in await rows(agent, action) if r["message_type"] == MSG_CANCEL_REQUEST]

        # Each level gives up at the deadline its master gave: the root on the coordinator
        # (and the coordinator on the specialist) tell their child, reason "deadline".
        async with asyncio.timeout(10):
            while not await cancels(coord, "received"):  # noqa: ASYNC110 - polled
                await asyncio.sleep(0.05)
        (received,) = [
            r for r in await rows(coord, "received") if r["message_type"] == MSG_COMMAND_REQUEST
        ]
        named = {r["details"]["request_id"] for r in await cancels(coord, "received")}
        assert received["message_id"] in named
        assert [r["target"] for r in await cancels(agents["root"], "sent")] == [str(coord.id)]
        # No level works on past it.
        await wait_for(lambda: all(a.in_flight == 0 for a in agents.values()), timeout=10)
        assert not events("finished", "d")


class Boss(Role):
    """A coordinator's role that asks about, and cancels, a request it sent its child."""

    @command
    async def oversee(self, child: str) -> dict[str, Any]:
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=self.agent.id,
            target=UUID(child),
            details={"command": "hold", "params": {"tag": "boss"}},
        )
        await self.agent.send_message(request, expects_reply=True)
        async with asyncio.timeout(10):
            while not events("started", "boss"):  # noqa: ASYNC110 - the witness is polled
                await asyncio.sleep(0.02)
        status = await self.agent.request_status(request.message_id, timeout=5)
        report = await self.agent.cancel(request.message_id, reason="enough", timeout=5)
        return {"status": status["state"], "cancel": report["state"]}


async def test_a_role_asks_about_and_cancels_a_request_through_its_handle(
    secure_broker_factory: Any, fleet: Any, tmp_path: Path
) -> None:
    secure = secure_broker_factory(fleet)
    spec_id = fleet.agent("specialist").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack, secure, tmp_path, {"specialist": [Worker()], "coordinator": [Boss()]}
        )
        await wait_for(lambda: "oversee" in agents["root"].advertised_commands())
        reply = await agents["root"].request(
            "oversee", {"child": str(spec_id)}, to=fleet.agent("coordinator").id, timeout=20
        )
        assert reply.details["result"] == {"status": "working", "cancel": "canceled"}
        await wait_for(lambda: events("cancelled", "boss"), timeout=5)


async def test_only_the_child_a_request_went_to_reports_its_progress(
    secure_broker_factory: Any, tmp_path: Path
) -> None:
    fleet = tree_fleet({"root": None, "worker": "root", "sibling": "root"})
    secure = secure_broker_factory(fleet)
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {"worker": [Worker()]})
        root, sibling = agents["root"], agents["sibling"]
        asked = asyncio.ensure_future(
            root.request("hold", {"tag": "p", "seconds": 2.0}, to=agents["worker"].id, timeout=10)
        )
        await wait_for(lambda: events("started", "p"))
        request_id = sent_request(root)
        seen: list[dict[str, Any]] = []

        async def follow() -> None:
            async for event in root.follow(request_id):
                seen.append(event)

        following = asyncio.ensure_future(follow())
        forged = new_message(
            "command_progress",
            source=sibling.id,
            target=root.id,
            details={"state": "working", "fraction": 0.99, "text": "not mine", "seq": 1},
            reply_to=request_id,
        )
        await sibling._session.publish(topics.inbox(root.id, sibling.id), serialize(forged))
        await asyncio.wait_for(asked, 10)
        await asyncio.wait_for(following, 5)
        assert all(e["details"].get("text") != "not mine" for e in seen)
        assert [e["state"] for e in seen][-1] == "completed"
        (row,) = await root.memory.find(forged.message_id)
        # Refused with its reason, never passed on (docs/security.md, F24).
        assert row["action"] == "rejected"
        assert str(row["reason"]).startswith("WRONG_ANSWERER: command_progress"), row
