"""Real ledger files for tests: seed 000's delegation written out, a writer killed mid-stream."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from uuid import UUID, uuid4

from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.messages import VOXMessage, new_message

ROOT, COORD, SPEC = uuid4(), uuid4(), uuid4()


def build_ledger(path: Path) -> dict[str, VOXMessage]:
    """Write the coordinator's ledger of a seed 000 delegation plus one unrelated request."""
    a1 = new_message(
        "command_request", source=ROOT, target=COORD, details={"command": "analyze", "params": {}}
    )
    e5 = new_message(
        "command_request",
        source=COORD,
        target=SPEC,
        details={"command": "analyze", "params": {}},
        reply_to=a1.message_id,
    )
    i9 = e5.reply("command_result", {"result": "[bold]done[/]"})
    m3 = a1.reply("command_result", {"command": "analyze", "result": "x", "handled_by": COORD})
    other = new_message(
        "command_request", source=ROOT, target=COORD, details={"command": "ping", "params": {}}
    )

    async def write() -> None:
        async with VOXAgentMemory(path) as ledger:
            await ledger.record_message(a1, "received")
            await ledger.record_message(other, "received")
            await ledger.record_message(e5, "sent")
            await ledger.record_message(i9, "received")
            await ledger.record_message(m3, "sent")
            await ledger.record_rejected(
                b"junk",
                "not valid JSON [line 1]",
                topic="vox/c/inbox/s",
                source=None,
                message_id=None,
            )

    asyncio.run(write())
    return {"a1": a1, "e5": e5, "i9": i9, "m3": m3, "other": other}


async def acknowledged_before_sigkill(
    script: str, *args: str, count: int
) -> list[tuple[int, UUID]]:
    """Run script, read `count` lines "ROW_ID MESSAGE_ID" it acknowledged, then SIGKILL it."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    acknowledged: list[tuple[int, UUID]] = []
    try:
        async with asyncio.timeout(60):
            while len(acknowledged) < count:
                line = await child.stdout.readline()
                assert line, "the child stopped before it was killed"
                row, mid = line.split()
                acknowledged.append((int(row), UUID(mid.decode())))
    finally:
        child.kill()  # SIGKILL, mid-stream: no close(), no checkpoint
        await child.wait()
    assert child.returncode == -9
    return acknowledged


async def assert_each_kept(ledger: VOXAgentMemory, acknowledged: list[tuple[int, UUID]]) -> None:
    """Check that every acknowledged record is in the ledger under the row id it was given."""
    for row_id, mid in acknowledged:
        (row,) = await ledger.find(mid)
        assert row["id"] == row_id
