"""The human's decisions on the freelance fleet: real broker, real ledgers, the root relaying.

Three overlapping jobs all reach the operator (an undecided job holds no time); approving one
and rejecting one books exactly the approved one; a later job that overlaps the approved one
does not fit, one that overlaps only the rejected one is notified. Refusals come back as
command_error with their reason, and a rejected row in the refusing agent's ledger.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AsyncExitStack
from typing import Any
from uuid import UUID, uuid4

import pytest

from examples.jobbook import APPROVE, REJECT
from tests.kits.agentkit import wait_for
from tests.kits.freelancekit import (
    Fixture,
    drop,
    fleet_fixture,
    future_mail,
    job_mail,
    seed_fleet,
)
from vox_mqtt.protocol.domain import MSG_DECISION, Decision
from vox_mqtt.protocol.errors import CommandFailed

__all__ = ["fleet_fixture", "seed_fleet"]  # the fixtures this module borrows


# Three jobs on one Monday, each overlapping the other two; each fits alone, no two together.
THREE = {
    "1-a.eml": future_mail(9, 13, 180, 10),  # 240 min allotted
    "2-b.eml": future_mail(11, 17, 240, 20),  # 360 min allotted
    "3-c.eml": future_mail(10, 12, 90, 30),  # 120 min allotted
}
OVERLAPS_A = future_mail(9, 12, 120, 40)  # A's share of 09-12 is 135 of 180 min: 45 free
ONLY_B = future_mail(14, 17, 120, 50)  # B is rejected, C ends at 12:00: all 180 min free


def by_price(f: Fixture) -> dict[int, dict[str, Any]]:
    return {n["details"]["price"]["value"]: n for n in f.inbox()}


def rows(f: Fixture, name: str, **match: str) -> list[sqlite3.Row]:
    return [r for r in f.ledger_rows(name) if all(r[k] == v for k, v in match.items())]


async def three_jobs(f: Fixture) -> dict[int, dict[str, Any]]:
    for count, (name, text) in enumerate(THREE.items(), start=1):
        drop(f.intake, name, text)
        # One at a time, so each notification's overlaps are the ones before it.
        await wait_for(lambda n=count: len(f.inbox()) == n, timeout=30)
    return by_price(f)


async def test_three_overlapping_jobs_reach_the_operator_and_only_the_approved_one_books(
    fleet_fixture: Fixture,
) -> None:
    f = fleet_fixture
    async with AsyncExitStack() as stack:
        await f.start(stack)
        assert f.console is not None
        jobs = await three_jobs(f)
        a, b = (UUID(jobs[price]["message_id"]) for price in (10, 20))
        # None withheld: each names the undecided jobs before it that it overlaps.
        assert jobs[10]["details"]["overlaps_undecided"] == []
        assert jobs[20]["details"]["overlaps_undecided"] == [str(a)]
        assert jobs[30]["details"]["overlaps_undecided"] == [str(a), str(b)]
        approved = await f.console.decide(a, "approve", note="yes", wait=10)
        rejected = await f.console.decide(b, "reject", wait=10)
        drop(f.intake, "4-overlaps-a.eml", OVERLAPS_A)
        drop(f.intake, "5-only-b.eml", ONLY_B)
        await wait_for(lambda: len(rows(f, "coordinator", action="not_notified")) == 1, timeout=30)
        await wait_for(lambda: 50 in by_price(f), timeout=30)
        book = f.agents["coordinator"].roles[0].book
        decisions = {job.value: job.decision for job in book.jobs()}
        numbered = f.console.jobs()
        chain = await f.agents["root"].memory.trace(a)
    assert approved.type == "decision_recorded"
    assert approved.details["outcome"].startswith("booked: 180 min of work")
    assert rejected.details["outcome"] == "nothing booked: it held no capacity, so none is freed"
    # Exactly the approved job holds time; the fourth job was not notified for it.
    assert decisions == {10: APPROVE, 20: REJECT, 30: None, 50: None}
    assert 40 not in by_price(f)
    (not_notified,) = rows(f, "coordinator", action="not_notified")
    assert "45 free" in json.loads(not_notified["details"])["reason"]
    assert by_price(f)[50]["details"]["overlaps_undecided"] == []
    # The operator's numbers, decisions and overlaps as `vox inbox` shows them.
    assert [(j.number, j.entry["details"]["price"]["value"]) for j in numbered] == [
        (1, 10),
        (2, 20),
        (3, 30),
        (4, 50),
    ]
    assert [None if j.decision is None else j.decision["verdict"] for j in numbered] == [
        "approve",
        "reject",
        None,
        None,
    ]
    assert numbered[2].overlaps == (1, 2)
    # The coordinator's ledger: the decision received, the approval row under its id, answered.
    decision_rows = rows(f, "coordinator", message_type="decision", action="received")
    assert {json.loads(r["details"])["verdict"] for r in decision_rows} == {"approve", "reject"}
    (approval,) = rows(f, "coordinator", event_type="job", action="approved")
    assert approval["message_id"] in {r["message_id"] for r in decision_rows}
    assert "booked" in json.loads(approval["details"])["outcome"]
    # The root's trace of job A: the job received, its notification, the decision, the
    # relayed decision and both answers, in one reply_to chain.
    kinds = [(r["message_type"], r["action"]) for r in chain]
    for expected in (
        ("job_detected", "received"),
        ("job_detected", "sent"),
        ("decision", "received"),
        ("decision", "sent"),
        ("decision_recorded", "received"),
        ("decision_recorded", "sent"),
    ):
        assert expected in kinds, kinds


async def test_refused_decisions_say_why_and_leave_a_rejected_row(fleet_fixture: Fixture) -> None:
    f = fleet_fixture
    past = "2026-01-12T09:00:00+00:00", "2026-01-12T17:00:00+00:00"
    async with AsyncExitStack() as stack:
        await f.start(stack)
        assert f.console is not None
        drop(f.intake, "1-future.eml", future_mail(9, 17, 60, 10))
        await wait_for(lambda: 10 in by_price(f), timeout=30)
        # A job whose window is over can still be notified; it cannot be decided.
        drop(f.intake, "2-past.eml", job_mail(*past, effort=60, price="20 USD"))
        await wait_for(lambda: 20 in by_price(f), timeout=30)
        future, over = (UUID(by_price(f)[price]["message_id"]) for price in (10, 20))
        await f.console.decide(future, "approve", wait=10)
        failures: dict[str, CommandFailed] = {}
        for name, job, verdict in (
            ("twice", future, "reject"),
            ("unknown", uuid4(), "approve"),
            ("expired", over, "approve"),
        ):
            with pytest.raises(CommandFailed) as caught:
                await f.console.decide(job, verdict, wait=10)
            failures[name] = caught.value
        # Nobody but the master may decide: a coordinator to the root, a specialist to it.
        root, coordinator = f.agents["root"], f.agents["coordinator"]
        specialist = f.agents["specialist_a"]
        for sender, master in ((coordinator, root), (specialist, coordinator)):
            with pytest.raises(CommandFailed) as caught:
                await sender.ask(
                    MSG_DECISION,
                    Decision(in_response_to=future, verdict="reject"),
                    to=master.id,
                    timeout=10,
                )
            failures[f"from {sender.name}"] = caught.value
        book = coordinator.roles[0].book
        decisions = {job.value: job.decision for job in book.jobs()}
    assert failures["twice"].code == "ALREADY_DECIDED"
    assert "was already approved at" in failures["twice"].error
    assert failures["unknown"].code == "UNKNOWN_JOB"
    assert failures["expired"].code == "JOB_EXPIRED"
    assert "its window ended at 2026-01-12T17:00:00+00:00" in failures["expired"].error
    assert failures["from coordinator"].code == "UNAUTHORIZED_SOURCE"
    assert failures["from specialist_a"].code == "UNAUTHORIZED_SOURCE"
    assert decisions == {10: APPROVE, 20: None}  # the refusals changed nothing
    # Each refusal is a rejected row where it was refused: unknown at the root, the rest at
    # the coordinator (relayed by the root, which records the refusal it passes back too).
    root_refused = [
        json.loads(r["details"])["code"]
        for r in rows(f, "root", event_type="decision", action="rejected")
    ]
    coord_refused = [
        json.loads(r["details"])["code"]
        for r in rows(f, "coordinator", event_type="decision", action="rejected")
    ]
    assert sorted(root_refused) == sorted(
        ["ALREADY_DECIDED", "UNKNOWN_JOB", "JOB_EXPIRED", "UNAUTHORIZED_SOURCE"]
    )
    assert sorted(coord_refused) == sorted(
        ["ALREADY_DECIDED", "JOB_EXPIRED", "UNAUTHORIZED_SOURCE"]
    )
    # The decisions file holds the one recorded decision.
    assert [d["verdict"] for d in f.console.decisions()] == ["approve"]
