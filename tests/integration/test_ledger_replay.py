"""Answers held for replay: never in the outbox, read back by request, purged after their time.

docs/ledger.md, "Answers held for replay"; docs/messages.md, "Answers need no acknowledgement".
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.messages import VOXMessage, new_message, parse, serialize

MASTER, ME = uuid4(), uuid4()


def request_to_me(deadline: str | None = None) -> VOXMessage:
    details: dict[str, object] = {"command": "analyze", "params": {}}
    if deadline is not None:
        details["deadline"] = deadline
    return new_message(
        "command_request", source=MASTER, target=ME, details=details, message_source="a@b.c"
    )


def answer_to(request: VOXMessage) -> VOXMessage:
    return request.reply("command_result", {"command": "analyze", "result": {"n": 1}})


async def test_an_answer_held_for_replay_is_read_back_whole_and_never_in_the_outbox(
    tmp_path: Path,
) -> None:
    async with VOXAgentMemory(tmp_path / "logs.db") as ledger:
        request = request_to_me()
        await ledger.record_message(request, LedgerAction.RECEIVED)
        answer = answer_to(request)
        until = time.time() + 60
        await ledger.record_message(
            answer, LedgerAction.SENT, outbox=("topic", serialize(answer)), replay_until=until
        )
        assert await ledger.pending_outbox() == []  # nothing re-sends it
        held = await ledger.held_answer(request.message_id)
        assert held is not None
        payload, kept_until = held
        again = parse(payload)
        assert again.message_id == answer.message_id  # the same message: the requester dedups
        assert again.details == answer.details
        assert again.message_source == "a@b.c"  # sealed in the file, its own when read back
        assert kept_until == until
        assert await ledger.held_answer(uuid4()) is None  # nothing answered under that id


async def test_an_answer_held_long_enough_leaves_with_a_later_batch(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    async with VOXAgentMemory(path) as ledger:
        request = request_to_me()
        answer = answer_to(request)
        await ledger.record_message(
            answer,
            LedgerAction.SENT,
            outbox=("topic", serialize(answer)),
            replay_until=time.time() - 1,  # its request's deadline long past
        )
        await ledger.record("message", "received", MASTER, ME, {"n": 1})  # the next batch
        assert await ledger.held_answer(request.message_id) is None
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM replay").fetchone()[0] == 0


async def test_an_answer_left_in_an_older_ledgers_outbox_is_held_for_replay_on_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "logs.db"
    deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    request = request_to_me(deadline=deadline.isoformat())
    answer = answer_to(request)
    event = new_message("job_done", source=ME, target=MASTER, details={})
    async with VOXAgentMemory(path) as ledger:
        await ledger.record_message(request, LedgerAction.RECEIVED)
        # As a ledger from before kept them: the answer, re-sent until acknowledged.
        await ledger.record_message(answer, LedgerAction.SENT, outbox=("t", serialize(answer)))
        await ledger.record_message(event, LedgerAction.SENT, outbox=("t", serialize(event)))
    async with VOXAgentMemory(path) as ledger:
        await ledger.init_db()
        # The event still waits for its ack; the answer is held for replay until the deadline.
        assert [json.loads(p)["type"] for _, _, p in await ledger.pending_outbox()] == ["job_done"]
        held = await ledger.held_answer(request.message_id)
        assert held is not None
        assert parse(held[0]).message_id == answer.message_id
        assert abs(held[1] - (deadline.timestamp() + 60)) < 0.01  # the deadline, plus the margin
