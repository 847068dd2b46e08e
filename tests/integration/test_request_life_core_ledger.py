"""What a request's life reads back from a real ledger (docs/ledger.md, canceled)."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST
from vox_mqtt.protocol.messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    VOXMessage,
    new_message,
)

MASTER, ME, CHILD = uuid4(), uuid4(), uuid4()


def delegated() -> tuple[VOXMessage, VOXMessage]:
    """A command from the master, and the request that sends it on to the child."""
    request = new_message(MSG_COMMAND_REQUEST, source=MASTER, target=ME, details={"command": "x"})
    down = new_message(
        MSG_COMMAND_REQUEST,
        source=ME,
        target=CHILD,
        details={"command": "x"},
        reply_to=request.message_id,
    )
    return request, down


def child_canceled(down: VOXMessage) -> VOXMessage:
    """The child's CANCELED answer to the request sent down to it."""
    return new_message(
        MSG_COMMAND_ERROR,
        source=CHILD,
        target=ME,
        details={"code": "CANCELED", "error": "x"},
        reply_to=down.message_id,
    )


async def test_a_crash_between_the_cancel_and_its_cancel_down_is_found_at_start(
    tmp_path: Path,
) -> None:
    request, down = delegated()
    async with VOXAgentMemory(tmp_path / "logs.db") as memory:
        await memory.record_message(request, "received", then=[(down, "sent", None)])
        assert await memory.untold_children() == []  # not canceled: nothing to tell
        await memory.record_message(request, "canceled", outcome="CANCELED")
        assert await memory.untold_children() == [(str(CHILD), str(down.message_id))]
        own, sent_down, cancels = await memory.request_rows(request.message_id)
        assert [r["action"] for r in own] == ["received", "canceled"]
        assert [r["message_id"] for r in sent_down] == [str(down.message_id)]
        assert cancels == []
        # Once its cancel_request is sent, the child counts as told.
        cancel = new_message(
            MSG_CANCEL_REQUEST,
            source=ME,
            target=CHILD,
            details={"request_id": str(down.message_id), "reason": "free text, never kept"},
        )
        await memory.record_message(cancel, "sent")
        assert await memory.untold_children() == []
        rows = await memory.find(cancel.message_id)
        assert rows[0]["details"]["request_id"] == str(down.message_id)
        assert "reason" not in rows[0]["details"]


async def test_a_cancel_passed_down_keeps_its_command_delegated_until_its_child_answers(
    tmp_path: Path,
) -> None:
    # The `canceling` row is no end: a restart adopts the command again, knowing its cancel
    # passed down, and tells the child when the crash came before its cancel_request.
    request, down = delegated()
    async with VOXAgentMemory(tmp_path / "logs.db") as memory:
        await memory.record_message(
            request, "received", then=[(down, "sent", None), (request, "delegated", str(CHILD))]
        )
        (adopted,) = await memory.delegated_commands()
        assert adopted["canceling"] is False
        await memory.record_message(request, "canceling", outcome="CANCELED")
        (adopted,) = await memory.delegated_commands()
        assert adopted["canceling"] is True
        assert adopted["downstream"]["message_id"] == str(down.message_id)
        assert await memory.untold_children() == [(str(CHILD), str(down.message_id))]
        assert [r["message_id"] for r in await memory.interrupted_commands()] == [
            str(request.message_id)
        ]
        assert await memory.pending_commands() == []
        # Its child's CANCELED, relayed up: the command ends `canceled`, nothing is adopted.
        answer = child_canceled(down)
        await memory.record_message(answer, "received")
        await memory.record_message(request, "canceled", outcome="CANCELED")
        assert await memory.delegated_commands() == []
        assert await memory.untold_children() == []


async def test_a_child_that_answered_needs_no_cancel(tmp_path: Path) -> None:
    request, down = delegated()
    answer = child_canceled(down)
    async with VOXAgentMemory(tmp_path / "logs.db") as memory:
        await memory.record_message(request, "received", then=[(down, "sent", None)])
        await memory.record_message(request, "canceled", outcome="CANCELED")
        await memory.record_message(answer, "received")
        assert await memory.untold_children() == []


async def test_cancels_received_are_remembered_newest_first(tmp_path: Path) -> None:
    named = [uuid4() for _ in range(3)]
    async with VOXAgentMemory(tmp_path / "logs.db") as memory:
        for request_id in named:
            cancel = new_message(
                MSG_CANCEL_REQUEST,
                source=MASTER,
                target=ME,
                details={"request_id": str(request_id)},
            )
            await memory.record_message(cancel, "received")
        assert await memory.remembered_cancels() == [str(n) for n in reversed(named)]
        assert await memory.remembered_cancels(limit=1) == [str(named[-1])]
        _, _, cancels = await memory.request_rows(named[0])
        assert len(cancels) == 1
