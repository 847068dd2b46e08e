"""Kill a process that writes a ledger, mid-stream, for durability tests on real files."""

from __future__ import annotations

import asyncio
import sys
from uuid import UUID

from vox_mqtt.ledger import VOXAgentMemory


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
