"""A SIGKILL at each commit of a hop, in each agent of the path: the fleet converges.

operator -> root -> coordinator -> specialist, each agent its own `vox-agent` process on
one real broker. For each role and each commit on the path of one command (named by the
rows it holds: docs/ledger.md, "Rows that commit together"), the agent kills itself just
before or just after that commit (tests/kits/killpoint.py), is restarted, and then:

- the operator holds exactly one answer to its request: a result or a clear failure;
- the non-idempotent command ran at most once (its tally file and its `started` rows), and
  exactly once when the answer is a result;
- an idempotent command is answered once (it may run twice by design);
- a command the specialist completed is not reported failed (one account of what happened);
- an answer recorded and never published (a kill just after its commit) reaches its
  requester by replay: the requester re-sends its request, and the restarted answerer
  records the copy `duplicate` and sends the answer it holds, never a second one;
- every outbox empties, no command is left pending or interrupted, and every ledger
  verifies (`vox ledger verify` on the killed agent's, the chain check on all; the last
  test runs `vox ledger verify` on every ledger once all the kills are done).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any, Literal
from uuid import UUID

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
    restarted,
    settled,
)
from tests.kits.killpoint import KillPoint
from vox_mqtt.cli import main as vox
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import VOXMessage

pytestmark = pytest.mark.slow

ANSWERS = ("command_result", "command_error")


def point(
    when: Literal["before", "after"], action: str, kind: str, command: str, acks: str | None
) -> KillPoint:
    return KillPoint(when, action, kind, command, acks)


def hop(
    command: str, groups: list[tuple[tuple[str, str], tuple[str, str], str | None]]
) -> list[KillPoint]:
    """Before the commit holding a group's first row and after the one holding its last.

    A group is rows docs/ledger.md says commit together; if a change splits one, these
    two points still bracket it.
    """
    return [
        p
        for first, last, acks in groups
        for p in (point("before", *first, command, acks), point("after", *last, command, acks))
    ]


REQUEST_IN = ("received", "command_request")
ACK_IN = ("received", "message_acknowledged")
# An agent that passes the command on: its arrival and delegation, the child's ack of the
# request passed down, the child's answer and this agent's answer up. No answer is
# acknowledged (docs/messages.md): before the child's answer is recorded, the child holds it
# for replay; after this agent's answer is recorded, it holds that one.
DELEGATING = [
    (REQUEST_IN, ("delegated", "command_request"), None),
    (ACK_IN, ACK_IN, "command_request"),
    (("received", "command_result"), ("sent", "command_result"), None),
]
# The agent that serves it: arrival and start, its answer and end.
SERVING = [
    (REQUEST_IN, ("started", "command_request"), None),
    (("sent", "command_result"), ("completed", "command_request"), None),
]
# An idempotent command answered at once: arrival, start, answer and end in one commit.
QUICK = [
    (REQUEST_IN, ("completed", "command_request"), None),
]
BY_ROLE = [
    [("root", p, False) for p in hop("tally", DELEGATING)],
    [("coordinator", p, False) for p in hop("tally", DELEGATING)],
    [
        *[("specialist", p, False) for p in hop("tally", SERVING)],
        *[("specialist", p, True) for p in hop("count", QUICK)],
    ],
]
# Roles take turns, so each daemon's next standby run has imported before it is needed.
CASES = [case for turn in itertools.zip_longest(*BY_ROLE) for case in turn if case is not None]
STANDBYS = 2  # per daemon, started ahead (tests/kits/killpoint.py, Standby)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    roles = ["tests.kits.agentkit:Tally", "tests.kits.killpoint:Counted"]
    with kill_fleet(tmp_path_factory.mktemp("kill-at-each-commit"), roles, STANDBYS) as found:
        yield found


@pytest.mark.parametrize(
    ("role", "point", "idempotent"),
    CASES,
    ids=[f"{role}-{p.command}-{p.label}" for role, p, _ in CASES],
)
async def test_a_kill_at_this_commit_converges(
    fleet: Fleet, role: str, point: KillPoint, idempotent: bool
) -> None:
    n, ledger = next(fleet.numbers), fleet.procs.ledger(role)
    with fleet.armed(role) as arm:
        async with operator_on(fleet, point.command) as console:
            point.arm(arm)
            answer = asked(console, point.command, {"n": n}, WAIT)
            batch = await died(fleet, role)
            await restarted(fleet, role)
            outcome = await answer
            async with settled(fleet, console.agent.memory) as memories:
                await check(fleet, memories, n, outcome, idempotent, batch)
                if point.when == "after":
                    await replayed(memories[role], batch, role)
        # `vox ledger DB verify` on the killed agent's ledger, in a thread (its own loop),
        # in this process: a process of its own would cost seconds of imports per test.
        code = await asyncio.to_thread(vox, ["ledger", str(ledger), "verify"])
        assert code == 0, f"vox ledger {ledger} verify exited {code}"


async def check(
    fleet: Fleet,
    memories: dict[str, VOXAgentMemory],
    n: int,
    outcome: VOXMessage | CommandFailed,
    idempotent: bool,
    batch: list[dict[str, Any]],
) -> None:
    """One answer, at most one run (one when it succeeded), one truth, ledgers that verify."""
    what = f"killed at a commit of {[(r['action'], r['message_type']) for r in batch]}"
    op_rows = await memories["operator"].get_recent(100_000)
    (request,) = [r for r in of_number(op_rows, n) if r["action"] == "sent"]
    answers = {
        r["message_id"]
        for r in op_rows
        if r["action"] == "received"
        and r["message_type"] in ANSWERS
        and r["reply_to"] == request["message_id"]
    }
    assert len(answers) == 1, f"{what}: the operator got {len(answers)} answers, {outcome!r}"
    ran = fleet.tallies(n)
    if isinstance(outcome, CommandFailed):
        # A clear failure from the fleet (work cut by the kill), never the operator's own
        # deadline: that would be an answer lost.
        assert outcome.code == "HANDLER_ERROR", f"{what}: {outcome!r}"
        assert ran <= 1 or idempotent, f"{what}: ran {ran} times"
    else:
        assert outcome.details["result"] == n
        assert ran == 1 or (idempotent and ran >= 1), f"{what}: ran {ran} times"
    spec_rows = of_number(await memories["specialist"].get_recent(100_000), n)
    if not idempotent:
        started = [r for r in spec_rows if r["action"] == "started"]
        assert len(started) <= 1, f"{what}: started {len(started)} times"
    # The fleet converges on one truth: a command its server completed is not reported to
    # the operator as failed (a request its caller was told had failed, run anyway).
    if any(r["action"] == "completed" for r in spec_rows):
        assert not isinstance(outcome, CommandFailed), (
            f"{what}: the specialist completed the command (ran {ran}x) but the operator"
            f" was answered {outcome.code}: {outcome.error}"
        )
    for name, memory in memories.items():
        report = await memory.verify()
        assert report.ok, f"{name}'s ledger: {report}"


async def replayed(memory: VOXAgentMemory, batch: list[dict[str, Any]], role: str) -> None:
    """An answer whose commit the kill followed was never published: it went by replay.

    Its requester re-sent the request, the restarted agent recorded the copy `duplicate`
    and sent the answer it held; it recorded no second answer (docs/ledger.md, "Answers
    held for replay").
    """
    sent = [r for r in batch if r["action"] == "sent" and r["message_type"] in ANSWERS]
    if not sent:
        return
    (answer,) = sent
    request = answer["reply_to"]
    rows = await memory.find(UUID(request))
    assert "duplicate" in [r["action"] for r in rows], f"{role}: {request} never re-sent"
    recent = await memory.get_recent(100_000)
    answers = [
        r
        for r in recent
        if r["action"] == "sent" and r["message_type"] in ANSWERS and r["reply_to"] == request
    ]
    assert [r["message_id"] for r in answers] == [answer["message_id"]], f"{role}: {answers}"


def test_every_ledger_verifies_with_vox_ledger_verify(fleet: Fleet, capsys: Any) -> None:
    """After all those kills (this module's last test), `vox ledger DB verify` passes on each."""
    operator = fleet.procs.root / "state" / fleet.procs.fleet.operator_name / "logs.db"
    for ledger in [*map(fleet.procs.ledger, DAEMONS), operator]:
        code = vox(["ledger", str(ledger), "verify"])
        out = capsys.readouterr().out
        assert code == 0, f"vox ledger {ledger} verify exited {code}: {out}"
        assert "hash chain intact" in out, out
