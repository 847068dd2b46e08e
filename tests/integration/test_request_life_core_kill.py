"""A SIGKILL at each commit of a cancel, in each agent of the path: the fleet converges.

operator -> root -> coordinator -> specialist as `vox-agent` processes on one real broker,
the specialist's handler running (a `tally` that would take a minute). The operator
cancels it; the chosen agent kills itself just before or just after the commit holding
its `canceling` row (root, coordinator: the cancel passes down) or its `canceled` row (the
specialist's with the cancel, the others' with their child's relayed answer)
(tests/kits/killpoint.py), is restarted, and then (docs/ledger.md, "Canceled, and what a
crash at each point proves"):

- the operator holds exactly one answer to its request: `CANCELED`, or the specialist's
  `HANDLER_ERROR` when the specialist was killed before its commit (its restart cut the
  handler, and that is the end relayed up: the truth, recorded `failed` `after_cancel`);
- the handler never finished and never started again (the tally file, the `started` rows);
- every outbox empties (the cancel and the answers were delivered), nothing is left
  pending or interrupted, and every ledger's chain verifies;
- a level killed right after its `canceling` commit tells its child after the restart
  (`untold_children`) and waits for its answer again (`delegated_commands`): every level
  records `canceled` once, and the two upper levels `canceling` once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Literal

import pytest

from tests.kits.killfleet import (
    DAEMONS,
    WAIT,
    Fleet,
    asked,
    died,
    kill_fleet,
    of_number,
    operator_on,
    poll,
    restarted,
    settled,
)
from tests.kits.killpoint import KillPoint
from vox_mqtt.ledger.actions import AFTER_CANCEL
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, ErrorCode

pytestmark = pytest.mark.slow

CASES = [
    (role, KillPoint(when, action, MSG_COMMAND_REQUEST, "tally"))
    for role in DAEMONS
    for action in (("canceled",) if role == "specialist" else ("canceling", "canceled"))
    for when in ("before", "after")
]
Case = tuple[str, Literal["before", "after"]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    roles = ["tests.kits.agentkit:Tally"]
    with kill_fleet(tmp_path_factory.mktemp("kill-at-each-cancel"), roles, 1) as found:
        yield found


async def started_at_specialist(fleet: Fleet, n: int) -> bool:
    async with VOXAgentMemory(fleet.procs.ledger("specialist"), read_only=True) as memory:
        rows = of_number(await memory.get_recent(1000), n)
    return any(r["action"] == "started" for r in rows)


@pytest.mark.parametrize(("role", "point"), CASES, ids=[f"{r}-{p.label}" for r, p in CASES])
async def test_a_kill_at_a_cancels_commit_converges(
    fleet: Fleet, role: str, point: KillPoint
) -> None:
    n = next(fleet.numbers)
    with fleet.armed(role) as arm:
        async with operator_on(fleet, "tally") as console:
            answer = asked(console, "tally", {"n": n, "seconds": 60}, 60)
            await poll(lambda: started_at_specialist(fleet, n), "the handler to start")
            (request,) = [
                t for t in console.agent.tracker.pending() if t.message.type == MSG_COMMAND_REQUEST
            ]
            point.arm(arm)
            cancel = asyncio.ensure_future(console.agent.cancel(request.message_id, timeout=WAIT))
            batch = await died(fleet, role)
            assert any(r["action"] == point.action for r in batch)
            await restarted(fleet, role)
            outcome = await asyncio.wait_for(answer, WAIT)
            with contextlib.suppress(CommandFailed):
                await cancel  # its report may have been cut with the killed agent
            assert isinstance(outcome, CommandFailed), outcome
            cut = role == "specialist" and point.when == "before"  # its restart cut the handler
            ends = {ErrorCode.CANCELED, ErrorCode.HANDLER_ERROR} if cut else {ErrorCode.CANCELED}
            assert outcome.code in ends, outcome
            async with settled(fleet, console.agent.memory) as memories:
                await check(memories, n, str(outcome.code))
        tallied = fleet.tally.read_text().split() if fleet.tally.exists() else []
        assert str(n) not in tallied  # the handler never finished, here or after a restart


async def check(memories: dict[str, VOXAgentMemory], n: int, code: str) -> None:
    op_rows = await memories["operator"].get_recent(100_000)
    (sent,) = [r for r in of_number(op_rows, n) if r["action"] == "sent"]
    answers = [
        r
        for r in op_rows
        if r["action"] == "received"
        and r["message_type"] == "command_error"
        and r["reply_to"] == sent["message_id"]
    ]
    assert len(answers) == 1, answers
    for name in DAEMONS:
        rows = of_number(await memories[name].get_recent(100_000), n)
        started = [r for r in rows if r["action"] == "started"]
        assert len(started) <= 1, f"{name} started it {len(started)} times"
        actions = [r["action"] for r in rows]
        if name != "specialist":  # each upper level passed the cancel down once
            assert actions.count("canceling") == 1, f"{name}: {actions}"
        if code == ErrorCode.HANDLER_ERROR:
            # The specialist killed before its commit restarts with its handler cut: it
            # reports that, and each upper level relays it, after its cancel.
            if name != "specialist":
                (end,) = [r for r in rows if r["action"] == "failed"]
                assert end["outcome"] == AFTER_CANCEL, end
            continue
        assert actions.count("canceled") == 1, f"{name}: {actions}"
    for name, memory in memories.items():
        report = await memory.verify()
        assert report.ok, f"{name}'s ledger: {report}"
