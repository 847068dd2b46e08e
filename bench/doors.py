"""The A2A door's cost: one command through `--a2a` against the same through the console.

operator -> root -> coordinator -> specialist (tests/kits/lifecyclekit.py), one `vox
console serve --a2a 127.0.0.1:0`. In one run, interleaved, N times each: `echo` sent as
`vox send` sends it through the console (`POST /v1/send` on its Unix socket, mode wait),
and as an A2A `message/send` with the a2a-sdk's own client (JSON-RPC, blocking). Printed:
each median and 90th percentile, and the difference of the medians (docs/a2a.md, "Cost").
Beside it, in the same run, bench/a2a_floor.py's experiment without fleet or console:
what the SDK alone costs per call over a plain JSON POST (`sdk_floor_delta_ms`).
Figure 19 of `make bench` (`--only doors`); by hand:

    python -m bench.doors [N]
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

from bench import a2a_floor
from bench.common import figure
from tests.kits.fleetproc import FleetProcesses, serving_vox
from tests.kits.lifecyclekit import lifecycle_fleet, route_up
from vox_mqtt.cli._home import reach

_WARM = 20
TARGET_MS = 1.0  # the door may cost at most this much more than the console, at the median


def _ready(log: str) -> str | None:
    found = re.search(r"serving A2A at (http://\S+/) ", log)
    return None if found is None or "listening on" not in log else found.group(1)


async def _measure(procs: FleetProcesses, tmp: Path, n: int) -> tuple[list[float], list[float]]:
    await route_up(procs, "echo")
    config = procs.operator_config
    serve = ["console", "serve", "--config", str(config), "--a2a", "127.0.0.1:0"]
    with serving_vox(serve, tmp / "console.log", _ready, "vox console serve") as (_, url):
        home = await reach(config, start=False)
        async with httpx.AsyncClient(timeout=60) as http:
            card = await A2ACardResolver(http, url).get_agent_card()
            client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)

            async def console(i: int) -> float:
                body = {"command": "echo", "params": {"text": str(i)}, "timeout": 30}
                started = time.perf_counter()
                kinds = [line["kind"] async for line in home.stream("/v1/send", body)]
                took = time.perf_counter() - started
                assert kinds[-1] == "answer", kinds
                return took

            async def a2a(i: int) -> float:
                part = Part()
                part.data.struct_value.update({"command": "echo", "params": {"text": str(i)}})
                message = Message(message_id=f"bench-{i}", role=Role.ROLE_USER, parts=[part])
                started = time.perf_counter()
                out = [
                    item async for item in client.send_message(SendMessageRequest(message=message))
                ]
                took = time.perf_counter() - started
                assert out[0].task.status.state == TaskState.TASK_STATE_COMPLETED, out
                return took

            for i in range(_WARM):
                await console(i)
                await a2a(-1 - i)
            through_console, through_a2a = [], []
            for i in range(n):
                through_console.append(await console(i))
                through_a2a.append(await a2a(i))
    return through_console, through_a2a


def _p90(took: list[float]) -> float:
    return sorted(took)[int(len(took) * 0.9)]


def report(n: int, through_console: list[float], through_a2a: list[float]) -> str:
    """Return the lines `python -m bench.doors` prints."""

    def line(name: str, took: list[float]) -> str:
        return (
            f"{name}: median {statistics.median(took) * 1000:.2f} ms, "
            f"p90 {_p90(took) * 1000:.2f} ms"
        )

    delta = statistics.median(through_a2a) - statistics.median(through_console)
    return "\n".join(
        [
            f"echo x{n}, interleaved, one run",
            line("console /v1/send (vox send's way)", through_console),
            line("A2A message/send", through_a2a),
            f"A2A door minus console, medians: {delta * 1000:+.2f} ms",
        ]
    )


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Figure 19: the A2A door's median against the console's, the same command interleaved."""
    n = 30 if quick else 300
    with lifecycle_fleet(workdir) as (procs, _):
        through_console, through_a2a = asyncio.run(_measure(procs, workdir, n))
    a2a_ms = statistics.median(through_a2a) * 1000
    console_ms = statistics.median(through_console) * 1000
    # The experiment without fleet or console: what the SDK alone costs over plain HTTP.
    floor: dict[str, Any] = a2a_floor.measure(n)
    return figure(
        title="A2A door: one command, message/send vs the console's /v1/send (median)",
        unit="ms",
        vox=a2a_ms,
        baseline=console_ms,
        target=f"at most +{TARGET_MS:g} ms at the median",
        met=a2a_ms - console_ms <= TARGET_MS,
        delta_ms=round(a2a_ms - console_ms, 2),
        a2a_p90_ms=round(_p90(through_a2a) * 1000, 2),
        console_p90_ms=round(_p90(through_console) * 1000, 2),
        n=n,
        **floor,
    )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with tempfile.TemporaryDirectory() as tmp, lifecycle_fleet(Path(tmp)) as (procs, _):
        took = asyncio.run(_measure(procs, Path(tmp), n))
    print(report(n, *took))


if __name__ == "__main__":
    main()
