"""Figure 17: a request's life through three levels, next to a three-level command round trip.

operator -> root -> coordinator -> specialist, all four agents in one process (the
all-in-one layout of figures 1-3). Three timings, each the median of N:

- a command round trip (`echo`, answered by the specialist): the baseline of both rows;
- a status query's round trip (`request_status` at the operator): the root answers from
  its ledger after asking the coordinator, which asks the specialist (docs/messages.md);
- from the operator's `cancel` call to the specialist's handler seeing its cancellation
  (its task cancelled), for a handler that runs until cancelled.

    python -m bench.request_life [--quick]
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

from bench.common import bench_broker, figure, fleet_text, latency_summary, run_alone
from bench.voxside import Echo, start_vox
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.agent.tracking import TrackedRequest
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, CommandRequest, new_message

SHAPE: dict[str, str | None] = {"root": None, "coordinator": "root", "spec_a": "coordinator"}
# The bound: a handler sees a cancel within 2 s of `vox cancel` (issue 23).
CANCEL_TARGET_MS = 2000.0


class Stuck(Role):
    """Runs until cancelled; tells the figure when it started and when it saw the cancel."""

    started: ClassVar[dict[int, asyncio.Event]] = {}
    cancelled_at: ClassVar[dict[int, float]] = {}

    @command
    async def stuck(self, n: int) -> int:
        self.started.setdefault(n, asyncio.Event()).set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled_at[n] = time.perf_counter()
            raise
        return n


def sizes(quick: bool) -> tuple[int, int, int]:
    """Return (round trips, status queries, cancels)."""
    return (20, 20, 5) if quick else (200, 200, 30)


async def _start(operator: VOXAgent, to: UUID, command_name: str, n: int) -> TrackedRequest:
    message = new_message(
        MSG_COMMAND_REQUEST,
        source=operator.config.id,
        target=to,
        details=CommandRequest(
            command=command_name,
            params={"n": n},
            deadline=(datetime.now(UTC) + timedelta(seconds=60)).isoformat(timespec="milliseconds"),
        ),
        message_source=operator.config.message_source,
    )
    return await operator.send_message(message, expects_reply=True)


async def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Time echo round trips, status queries and cancels through three levels."""
    count, queries, cancels = sizes(quick)
    Stuck.started.clear()
    Stuck.cancelled_at.clear()
    with bench_broker(workdir, fleet_text(SHAPE)) as bench:
        async with AsyncExitStack() as stack:
            roles: dict[str, tuple[type[Role], ...]] = {"spec_a": (Echo, Stuck)}
            operator, agents = await start_vox(stack, bench, SHAPE, roles)
            root = agents["root"].config.id
            for _ in range(3):  # warm-up
                await operator.request("echo", {"text": "warm"}, to=root, timeout=30)
            trips = []
            for _ in range(count):
                started = time.perf_counter()
                await operator.request("echo", {"text": "x"}, to=root, timeout=30)
                trips.append((time.perf_counter() - started) * 1000)

            first = await _start(operator, root, "stuck", 0)
            async with asyncio.timeout(30):
                await Stuck.started.setdefault(0, asyncio.Event()).wait()
            statuses = []
            for _ in range(queries):
                started = time.perf_counter()
                report = await operator.request_status(first.message.message_id, timeout=30)
                statuses.append((time.perf_counter() - started) * 1000)
            depth = _depth(report)
            await operator.cancel(first.message.message_id, reason="bench", timeout=30)

            seen, answered = [], []
            for n in range(1, cancels + 1):
                tracked = await _start(operator, root, "stuck", n)
                async with asyncio.timeout(30):
                    await Stuck.started.setdefault(n, asyncio.Event()).wait()
                started = time.perf_counter()
                await operator.cancel(tracked.message.message_id, reason="bench", timeout=30)
                answered.append((time.perf_counter() - started) * 1000)
                async with asyncio.timeout(30):
                    while n not in Stuck.cancelled_at:  # noqa: ASYNC110
                        await asyncio.sleep(0.001)
                seen.append((Stuck.cancelled_at[n] - started) * 1000)
                async with asyncio.timeout(30):
                    await tracked.done.wait()  # its CANCELED answer, before the next one
    trip = latency_summary(trips)
    status = latency_summary(statuses)
    cancel = latency_summary(seen)
    return [
        figure(
            title="Status query through three levels (p50), against a three-level echo round trip",
            unit="ms",
            vox=status["p50_ms"],
            baseline=trip["p50_ms"],
            target="reported",
            met=None,
            vox_detail={**status, "levels_in_report": depth},
            baseline_detail=trip,
            layout="all-in-one",
        ),
        figure(
            title="Cancel: operator's call -> the specialist's handler cancelled (p50), "
            "against a three-level echo round trip",
            unit="ms",
            vox=cancel["p50_ms"],
            baseline=trip["p50_ms"],
            target=f"p99 < {CANCEL_TARGET_MS:.0f} ms",
            met=cancel["p99_ms"] < CANCEL_TARGET_MS,
            vox_detail={**cancel, "cancel_report": latency_summary(answered)},
            baseline_detail=trip,
            layout="all-in-one",
        ),
    ]


def _depth(report: dict[str, Any]) -> int:
    depth = 0
    part: Any = report
    while isinstance(part, dict):
        depth += 1
        part = part.get("below")
    return depth


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 17 in its own event loop."""
    return asyncio.run(measure(workdir, quick))


def main() -> int:
    """Run figure 17 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
