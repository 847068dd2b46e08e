"""The freelance roles in-process on the fleet's real, ACL-secured broker."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest

from examples.freelance import MailWatcher
from tests.kits.agentkit import start_agents, wait_for
from tests.kits.freelancekit import (
    NOTE,
    Fixture,
    drop,
    fleet_fixture,
    future_mail,
    job_mail,
    next_monday,
    seed_fleet,
)
from vox_mqtt.protocol.errors import CommandFailed

__all__ = ["fleet_fixture", "seed_fleet"]  # the fixtures this module borrows


async def test_an_email_file_becomes_a_notification_in_the_operator_inbox(
    fleet_fixture: Fixture,
) -> None:
    f = fleet_fixture
    async with AsyncExitStack() as stack:
        await f.start(stack)
        drop(f.intake, "job-1.eml", job_mail())
        await wait_for(lambda: len(f.inbox()) == 1)
        await wait_for(lambda: (f.intake / "processed" / "job-1.eml").exists())
        coordinator = f.agents["coordinator"]
    entry = f.inbox()[0]
    assert entry["message_source"] == "ana@netwire.example"
    details = entry["details"]
    assert details["note_to_human"] == f"Subject: Translation\n\n{NOTE}"
    assert details["price"] == {"currency": "USD", "value": 30}
    assert details["start_time"] == "2026-01-12T09:00:00+00:00"
    assert details["estimated_effort_minutes"] == 60
    assert not list(f.intake.glob("*.eml"))
    # The coordinator got it from the specialist and notified the root; the root the operator.
    assert len(f.received_jobs("coordinator")) == 1
    assert len(f.received_jobs("root")) == 1
    notified = [r for r in f.ledger_rows("coordinator") if r["action"] == "notified"]
    assert len(notified) == 1
    assert json.loads(notified[0]["details"])["in_response_to"] == str(
        f.received_jobs("coordinator")[0]["message_id"]
    )
    # note_to_human is nowhere in the coordinator's ledger, book or files.
    for path in (f.tmp / "coordinator").rglob("*"):
        if path.is_file():
            assert b"Netwire" not in path.read_bytes(), path
            assert b"note_to_human" not in path.read_bytes(), path
    assert (f.tmp / "coordinator" / "jobs.json").exists()
    assert coordinator.roles[0].book.jobs()[0].value == 30


async def test_bad_intake_files_are_rejected_kept_and_never_sent(
    fleet_fixture: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    f = fleet_fixture
    caplog.set_level(logging.WARNING, logger="examples.freelance")
    bad = {
        "a-missing.eml": job_mail().replace("Price: 30 USD\n", "").replace("Start:", "X-Start:"),
        "b-naive.eml": job_mail(start="2026-01-12T09:00:00"),
        "c-negative.eml": job_mail(price="-30 USD"),
        "d-backwards.eml": job_mail(end="2026-01-12T08:00:00+00:00"),
        "e-garbage.eml": "\x00\x01 not a mail at all\n",
    }
    async with AsyncExitStack() as stack:
        await f.start(stack)
        for name, text in bad.items():
            drop(f.intake, name, text)
        # A good file last: once it is through, every bad one was looked at.
        drop(f.intake, "z-good.eml", job_mail())
        await wait_for(lambda: len(f.inbox()) == 1)
        await wait_for(lambda: len(list((f.intake / "rejected").iterdir())) == 2 * len(bad))
    rejected = f.intake / "rejected"
    for name, text in bad.items():
        assert (rejected / name).read_text() == text  # nothing lost
    reasons = {name: (rejected / f"{name}.reason").read_text().strip() for name in bad}
    assert reasons["a-missing.eml"] == "missing Start:, Price:"
    assert "has no timezone" in reasons["b-naive.eml"]
    assert "is negative" in reasons["c-negative.eml"]
    assert "is not after Start" in reasons["d-backwards.eml"]
    assert "is not a 'Name: value' header" in reasons["e-garbage.eml"]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for name in bad:
        line = next(line for line in lines if f"rejected intake file {name}:" in line)
        assert reasons[name] in line
        assert "\n" not in line
    # Nothing was sent for them: only the good file's job reached the coordinator.
    assert len(f.received_jobs("coordinator")) == 1
    sent = [
        r
        for r in f.ledger_rows("specialist_a")
        if r["message_type"] == "job_detected" and r["action"] == "sent"
    ]
    assert len(sent) == 1


async def test_jobs_that_do_not_fit_the_time_approved_jobs_leave_are_not_notified(
    fleet_fixture: Fixture,
) -> None:
    f = fleet_fixture
    async with AsyncExitStack() as stack:
        await f.start(stack)
        assert f.console is not None
        drop(f.intake, "1-monday.eml", future_mail(9, 17, 400, 30))
        await wait_for(lambda: len(f.inbox()) == 1)
        await f.console.decide(UUID(f.inbox()[0]["message_id"]), "approve", wait=10)
        # Only 80 of Monday's 480 minutes are left, and Saturday has none.
        drop(f.intake, "2-too-big.eml", future_mail(9, 17, 100, 50))
        saturday = next_monday(9) + timedelta(days=5)
        drop(
            f.intake,
            "3-saturday.eml",
            job_mail(saturday.isoformat(), (saturday + timedelta(hours=3)).isoformat(), effort=10),
        )
        drop(f.intake, "4-fits.eml", future_mail(9, 17, 80, 20))
        await wait_for(lambda: len(list((f.intake / "processed").iterdir())) == 4)
        await wait_for(lambda: len(f.inbox()) == 2)
        await wait_for(
            lambda: (
                len([r for r in f.ledger_rows("coordinator") if r["action"] == "not_notified"]) == 2
            )
        )
    assert [n["details"]["price"]["value"] for n in f.inbox()] == [30, 20]
    not_notified = [r for r in f.ledger_rows("coordinator") if r["action"] == "not_notified"]
    assert len(not_notified) == 2
    assert all("does not fit" in json.loads(r["details"])["reason"] for r in not_notified)
    assert len(f.received_jobs("coordinator")) == 4


async def test_financial_summary_goes_root_to_coordinator_and_back(fleet_fixture: Fixture) -> None:
    f = fleet_fixture
    monday = next_monday()
    async with AsyncExitStack() as stack:
        await f.start(stack)
        assert f.console is not None
        drop(f.intake, "1.eml", future_mail(9, 17, 60, 30))
        drop(f.intake, "2.eml", future_mail(9, 17, 60, 45))
        drop(f.intake, "3.eml", future_mail(9, 10, 60, 99, weeks=2))
        drop(f.intake, "4.eml", future_mail(9, 17, 60, 7))
        await wait_for(lambda: len(f.inbox()) == 4)
        # Only approved jobs count: the fourth stays undecided.
        for entry in f.inbox():
            if entry["details"]["price"]["value"] != 7:
                await f.console.decide(UUID(entry["message_id"]), "approve", wait=10)
        reply = await f.console.send_command(
            "financial_summary",
            {
                "start_date": monday.isoformat(),
                "end_date": (monday + timedelta(hours=23, minutes=59)).isoformat(),
            },
            wait=10,
        )
        with pytest.raises(CommandFailed) as failure:
            await f.console.send_command(
                "financial_summary",
                {"start_date": "2026-01-01T00:00:00", "end_date": "2026-01-31T00:00:00+00:00"},
                wait=10,
            )
        root = f.agents["root"]
    result = reply.details["result"]
    assert result["total"] == {"currency": "USD", "value": 75}
    assert result["jobs"] == 2
    assert result["answered_by"] == ["coordinator"]
    (attachment,) = result["attachments"]
    csv_text = Path(attachment).read_text()
    assert Path(attachment).parent == f.tmp / "coordinator" / "reports"
    assert len(csv_text.splitlines()) == 3  # header and two jobs
    assert reply.details["handled_by"] == str(root.id)
    # The operator's date, refused before the handler ran (docs/messages.md, INVALID_PARAMS).
    assert failure.value.code == "INVALID_PARAMS"
    assert failure.value.error.startswith("parameter 'start_date': ")
    assert "has no timezone" in failure.value.error
    # The data_response answers the data_request: reply_to links them in both ledgers.
    rows = f.ledger_rows("root")
    request = next(r for r in rows if r["message_type"] == "data_request")
    response = next(r for r in rows if r["message_type"] == "data_response")
    assert response["reply_to"] == request["message_id"]
    assert json.loads(response["details"])["request_id"] == request["message_id"]


async def test_analyze_goes_down_the_tree_and_back(fleet_fixture: Fixture) -> None:
    f = fleet_fixture
    async with AsyncExitStack() as stack:
        await f.start(stack)
        root = f.agents["root"]
        await wait_for(lambda: "analyze" in root.advertised_commands())
        assert f.console is not None
        reply = await f.console.send_command("analyze", {"target": "invoice.pdf"}, wait=10)
        root_chain = await root.memory.trace(reply.message_id)
        coordinator = f.agents["coordinator"]
        from_root = next(
            r
            for r in await coordinator.memory.get_recent(100)
            if r["message_type"] == "command_request" and r["source"] == str(root.id)
        )
        chain = await coordinator.memory.trace(from_root["message_id"])
    result = reply.details["result"]
    assert result["kind"] == "file name (.pdf)"
    # The answer reaching the root names no specialist: not by name, not by id.
    assert "analyst" not in result
    for name in ("specialist_a", "specialist_b"):
        assert name not in json.dumps(reply.details)
        assert str(f.agents[name].id) not in json.dumps(reply.details)
    assert reply.details["handled_by"] == str(root.id)
    kinds = ["command_request", "command_request", "command_result", "command_result"]
    # Each ledger holds its own hop: request in, request down, result up, result out.
    root_chain = [r for r in root_chain if r["message_type"] != "message_acknowledged"]
    chain = [r for r in chain if r["message_type"] != "message_acknowledged"]
    assert [row["message_type"] for row in root_chain] == kinds
    assert [row["message_type"] for row in chain] == kinds
    assert root_chain[1]["message_id"] == from_root["message_id"]
    assert chain[-1]["reply_to"] == from_root["message_id"]


async def test_a_file_sent_while_the_coordinator_is_down_is_kept_and_sent_again(
    fleet_fixture: Fixture,
) -> None:
    f = fleet_fixture
    async with AsyncExitStack() as stack:
        # Only the specialist: its job_detected is never acknowledged.
        watcher = MailWatcher(
            settings={
                "intake_dir": str(f.intake),
                "poll_interval": 0.05,
                "settle": 0.05,
                "retry_after": 0.2,
            }
        )
        await start_agents(
            stack,
            f.secure,
            f.tmp,
            {"specialist_a": [watcher]},
            ["specialist_a"],
            request_timeout=0.5,
        )
        drop(f.intake, "job.eml", job_mail())
        await wait_for(
            lambda: any(
                r["action"] == "sent" and r["message_type"] == "job_detected"
                for r in f.ledger_rows("specialist_a")
            )
        )
        await asyncio.sleep(0.8)
        assert (f.intake / "job.eml").exists()
    first_ids = {r["message_id"] for r in f.ledger_rows("specialist_a") if r["action"] == "sent"}
    async with AsyncExitStack() as stack:
        await f.start(stack)
        await wait_for(lambda: len(f.inbox()) == 1)
        await wait_for(lambda: (f.intake / "processed" / "job.eml").exists())
    # The re-sent job is the same message (its id comes from the file), received once.
    (received,) = f.received_jobs("coordinator")
    assert received["message_id"] in first_ids
