"""A three-level fleet of `vox-agent` processes that kill themselves at a chosen commit.

What tests/integration/test_kill_at_each_commit.py and test_request_life_core_kill.py share:
operator -> root -> coordinator -> specialist on one real broker, each daemon run through
tests/kits/killpoint.py with its arm file, standby runs started ahead, and the waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kits.fleetproc import (
    AgentProcess,
    FleetProcesses,
    fleet_text,
    run_fleet,
    wait_for_route,
)
from tests.kits.killpoint import ENV, MODULE, Standby, fired
from tests.kits.lifecyclekit import outbox_size
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage
from vox_mqtt.protocol.topics import STATUS_FILTER

DAEMONS = ("root", "coordinator", "specialist")
SHAPE = {"root": None, "coordinator": "root", "specialist": "coordinator"}
SERVING_LINE = "INFO vox-agent: serving "  # the daemon's log line once it is connected
WAIT = 20.0  # seconds: any one step; a kill point converges in a few


@dataclass
class Fleet:
    """The running fleet, its tally file, the arm file and the next run of each daemon."""

    procs: FleetProcesses
    tally: Path
    numbers: Iterator[int]
    standbys_per_daemon: int = 1
    standbys: dict[str, list[Standby]] = field(default_factory=dict)

    def arm_file(self, name: str) -> Path:
        return self.procs.root / f"killpoint-{name}.json"

    def restart(self, name: str) -> None:
        """Start the killed daemon again (its standby run, already imported)."""
        self.standbys[name].pop(0).go()  # the oldest: it has had the longest to import

    def ready_standbys(self) -> None:
        """Keep standbys_per_daemon standby runs of each daemon started ahead."""
        for name in DAEMONS:
            queue = self.standbys.setdefault(name, [])
            while len(queue) < self.standbys_per_daemon:
                queue.append(Standby(self.procs.agents[name]))

    @contextlib.contextmanager
    def armed(self, name: str) -> Iterator[Path]:
        """One kill test on a daemon: its arm file; the logs if it fails; disarmed after."""
        arm = self.arm_file(name)
        try:
            yield arm
        except BaseException:
            print(self.procs.logs()[-20000:])
            raise
        finally:
            arm.unlink(missing_ok=True)  # a point never reached must not fire in a later test
            self.ready_standbys()

    def tallies(self, n: int) -> int:
        text = self.tally.read_text() if self.tally.exists() else ""
        return text.split().count(str(n))


@contextlib.contextmanager
def kill_fleet(root: Path, specialist_roles: list[str], standbys: int) -> Iterator[Fleet]:
    """Run the fleet, every daemon armed through its kill-point file; stop it after."""
    tally = root / "tally.txt"
    roles = {"specialist": specialist_roles}
    settings = {"specialist": {"tally_file": str(tally)}}
    with run_fleet(root, fleet_text(SHAPE, roles=roles, settings=settings), start=False) as procs:
        found = Fleet(procs, tally, itertools.count(1), standbys)
        for name in DAEMONS:
            agent = procs.agents[name]
            agent.module, agent.env = MODULE, {ENV: str(found.arm_file(name))}
        procs.start_all()
        found.ready_standbys()
        try:
            yield found
        finally:
            for queue in found.standbys.values():
                for standby in queue:
                    standby.cancel()


async def poll(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Await check() (sync or async) until it returns something true; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def ledgers(fleet: Fleet) -> AsyncIterator[dict[str, VOXAgentMemory]]:
    """Open every daemon's ledger read-only beside the daemon writing it."""
    async with AsyncExitStack() as stack:
        yield {
            name: await stack.enter_async_context(
                VOXAgentMemory(fleet.procs.ledger(name), read_only=True)
            )
            for name in DAEMONS
        }


@asynccontextmanager
async def operator_on(fleet: Fleet, command: str) -> AsyncIterator[OperatorConsole]:
    """An operator console on the fleet, once the root offers the command."""
    async with OperatorConsole(fleet.procs.operator_config, observe=[STATUS_FILTER]) as console:
        await wait_for_route(console, command, timeout=WAIT)
        yield console


def asked(
    console: OperatorConsole, command: str, params: dict[str, Any], wait: float
) -> asyncio.Future[VOXMessage | CommandFailed]:
    """Send a command in the background: its answer, or the CommandFailed it ended in."""

    async def ask() -> VOXMessage | CommandFailed:
        try:
            return await console.send_command(command, params, wait=wait)
        except CommandFailed as exc:
            return exc

    return asyncio.ensure_future(ask())


async def died(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    """Wait until the daemon killed itself at its armed point; return the rows it fired at."""
    agent = fleet.procs.agents[name]
    await poll(lambda: not _alive(agent), f"{name} to reach the point and die")
    assert agent.process is not None
    assert agent.process.returncode == -signal.SIGKILL, agent.log()[-3000:]
    batch: list[dict[str, Any]] = json.loads(fired(fleet.arm_file(name)).read_text())
    return batch


def _alive(agent: AgentProcess) -> bool:
    return agent.process is not None and agent.process.poll() is None


async def restarted(fleet: Fleet, name: str) -> None:
    """Start a killed daemon again and wait until it serves (one more serving line)."""
    agent = fleet.procs.agents[name]
    runs = agent.log().count(SERVING_LINE)
    fleet.restart(name)
    await poll(lambda: agent.log().count(SERVING_LINE) > runs, f"{name} to serve again")


@asynccontextmanager
async def settled(
    fleet: Fleet, operator: VOXAgentMemory
) -> AsyncIterator[dict[str, VOXAgentMemory]]:
    """Every daemon's ledger and the operator's, once the fleet has converged."""
    async with ledgers(fleet) as memories:
        memories["operator"] = operator
        await poll(lambda: converged(memories), "every outbox to empty")
        yield memories


async def converged(memories: dict[str, VOXAgentMemory]) -> bool:
    """Nothing left to re-send anywhere, nothing acknowledged and not yet answered.

    The outbox is counted with sqlite3 itself (tests/kits/lifecyclekit.py): a read-only
    ledger holds no key to unseal VOXAgentMemory.pending_outbox() with.
    """
    for name, memory in memories.items():
        if outbox_size(memory.path):
            return False
        if name in DAEMONS and (
            await memory.pending_commands() or await memory.interrupted_commands()
        ):
            return False
    return True


def of_number(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Rows about a command_request whose params are {"n": n}."""
    return [
        r
        for r in rows
        if r["message_type"] == MSG_COMMAND_REQUEST
        and (r["details"] or {}).get("params", {}).get("n") == n
    ]
