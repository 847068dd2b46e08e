"""A root's role for the web console's tests (docs/web.md): a job for the human, a slow
command, one in flight until the test opens its gate, and a failing one, so the inbox and
the requests pages have something to show."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from vox_mqtt.agent.roles import Role, command
from vox_mqtt.protocol.domain import MSG_JOB_DETECTED, JobDetected, Price
from vox_mqtt.protocol.signing import seal_note


class Notifier(Role):
    """Tell the operator of a job (note_to_human as given, sealed in a signed fleet), or take
    a while, or wait for the test's gate, or fail."""

    @command
    async def tell(self, note: str, source: str) -> str:
        start = datetime.now(UTC) + timedelta(days=1)
        job = JobDetected(
            start_time=start.isoformat(),
            end_time=(start + timedelta(hours=2)).isoformat(),
            estimated_effort_minutes=90,
            price=Price(currency="EUR", value=300),
            note_to_human=seal_note(note, self.agent.config.broker.signing),
        )
        tracked = await self.agent.notify_master(MSG_JOB_DETECTED, job, message_source=source)
        return str(tracked.message_id)

    @command
    async def linger(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @command
    async def hold(self, gate: str) -> str:
        # In flight until the test creates the file `gate` (the agent runs in a process of
        # its own: a file is the gate both see), not for a time a loaded machine stretches.
        while not Path(gate).exists():  # noqa: ASYNC110 - another process opens the gate
            await asyncio.sleep(0.05)
        return "released"

    @command
    async def refuse(self) -> None:
        raise RuntimeError("refused on purpose")
