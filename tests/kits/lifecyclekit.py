"""A request's life on real daemons: operator -> root -> coordinator -> specialist.

The specialist mounts `Lifecycle`: a command that runs until it is cancelled (`stuck`),
one that reports progress step by step (`steps`), one that reports in a tight loop
(`spin`), `echo`, and `probe_master`, which sends its own master a status query and a
cancel (a child is not its master's master: both must be refused). Each run of a handler
leaves lines in the events file (`started N at`, `cancelled N at`), the witness of what
ran, read by the tests with `events()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

from tests.kits.brokerkit import Witness
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet, wait_for_route
from vox_mqtt.agent.roles import Role, command
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol.topics import STATUS_FILTER

SHAPE = {"root": None, "coordinator": "root", "specialist": "coordinator"}
DAEMONS = tuple(SHAPE)
SERVING_LINE = "INFO vox-agent: serving "  # the daemon's log line once it is connected


class Lifecycle(Role):
    """The specialist's commands whose life the tests follow."""

    def _note(self, line: str) -> None:
        with open(self.settings["events_file"], "a", encoding="utf-8") as handle:
            handle.write(f"{line} {time.time():.6f}\n")

    @command
    async def stuck(self, n: int) -> int:
        """Run until cancelled, noting when it started and when it saw the cancel."""
        self._note(f"started {n}")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self._note(f"cancelled {n}")
            raise
        return n

    @command
    async def steps(self, count: int, pause: float) -> int:
        """Report `count` steps of progress, `pause` seconds apart."""
        for i in range(1, count + 1):
            await self.agent.progress(i / count, f"step {i}")
            await asyncio.sleep(pause)
        return count

    @command
    async def spin(self, seconds: float) -> int:
        """Report progress in a tight loop for `seconds`; return how many reports were made."""
        made = 0
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            made += 1
            await self.agent.progress(None, f"spin {made}")
            await asyncio.sleep(0)
        return made

    @command
    async def echo(self, text: str = "") -> str:
        """Answer the text it is given.

        This second paragraph stays with the handler: the advertisement carries the first.
        """
        return text

    @command
    async def probe_master(self, request_id: str) -> str:
        """Send this agent's master a status query and a cancel, as only a master may."""
        master = self.agent.config.master_id
        assert master is not None
        details = {"request_id": request_id}
        await self.agent.send("status_query", details, to=master)
        await self.agent.send("cancel_request", {**details, "reason": "probe"}, to=master)
        return "sent"


class Analyst(Role):
    """A quick command for the pair of specialists of `pair_fleet`, noted when it runs."""

    def _note(self, line: str) -> None:
        with open(self.settings["events_file"], "a", encoding="utf-8") as handle:
            handle.write(f"{line} {time.time():.6f}\n")

    @command
    async def analyze(self, n: int, target: str) -> str:
        """Analyze a target at once, noting run n in the events file (`analyzed N at`)."""
        self._note(f"analyzed {n}")
        return f"{target}: analyzed"

    @command
    async def grind(self, n: int, seconds: float) -> str:
        """Work `seconds` holding the event loop (nothing else is read meanwhile, a cancel
        neither), noting `grinding N` and `ground N`: its result is claimed before any
        cancel that came meanwhile is read, so it ends completed whatever came."""
        self._note(f"grinding {n}")
        time.sleep(seconds)  # noqa: ASYNC251 - held on purpose
        self._note(f"ground {n}")
        return f"ground {n}"


# Two specialists under the coordinator, either of which may serve `analyze`.
PAIR_SHAPE = {
    "root": None,
    "coordinator": "root",
    "specialist_a": "coordinator",
    "specialist_b": "coordinator",
}
PAIR = ("specialist_a", "specialist_b")


def events(path: Path) -> list[tuple[str, int, float]]:
    """Return the events file's lines as (what, n, at)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        what, n, at = line.split()
        found.append((what, int(n), float(at)))
    return found


def event_at(path: Path, what: str, n: int) -> float | None:
    """Return when the handler of run n noted `what` (its first time), or None."""
    times = [at for w, k, at in events(path) if (w, k) == (what, n)]
    return times[0] if times else None


@contextlib.contextmanager
def lifecycle_fleet(tmp: Path) -> Iterator[tuple[FleetProcesses, Path]]:
    """Run the three daemons and the broker; yield them and the specialist's events file."""
    events_file = tmp / "events.txt"
    roles = {"specialist": ["tests.kits.lifecyclekit:Lifecycle"]}
    settings = {"specialist": {"events_file": str(events_file)}}
    with run_fleet(tmp, fleet_text(SHAPE, roles=roles, settings=settings)) as procs:
        yield procs, events_file


@contextlib.contextmanager
def pair_fleet(
    tmp: Path, *, heartbeat: float, keepalive: int
) -> Iterator[tuple[FleetProcesses, Path]]:
    """Run root, coordinator and two `Analyst` specialists; yield them and the events file.

    A specialist frozen for less than three `heartbeat` intervals is still a healthy child
    (docs/liveness.md), and for less than 1.5 `keepalive` still connected: a request is
    still delegated to it, and waits in its socket.
    """
    events_file = tmp / "events.txt"
    roles = {name: ["tests.kits.lifecyclekit:Analyst"] for name in PAIR}
    settings = {name: {"events_file": str(events_file)} for name in PAIR}
    text = fleet_text(PAIR_SHAPE, roles=roles, settings=settings, heartbeat=heartbeat)
    with run_fleet(tmp, text, keepalive=keepalive) as procs:
        yield procs, events_file


async def route_up(procs: FleetProcesses, command: str) -> None:
    """Wait until the root offers one of the specialist's commands (the console closes after)."""
    async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
        await wait_for_route(console, command, timeout=60)


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Return check()'s first true value; fail after timeout."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)
    return found


def agent_id(procs: FleetProcesses, name: str) -> UUID:
    """Return the id of an agent of the fleet (the operator's too)."""
    if name == "operator":
        return procs.fleet.operator_id
    return procs.fleet.agent(name).id


def ledger_dump(path: Path) -> str:
    """Return every table of a ledger as SQL text, read-only beside the daemon writing it."""
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
        db.execute("PRAGMA busy_timeout = 10000")
        return "\n".join(db.iterdump())


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    """Return a ledger's message rows (read-only, with sqlite3 itself), oldest first."""
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
        db.execute("PRAGMA busy_timeout = 10000")
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM logs ORDER BY id")]


def outbox_size(path: Path) -> int:
    """Count a ledger's outbox entries (read-only)."""
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
        db.execute("PRAGMA busy_timeout = 10000")
        return int(db.execute("SELECT count(*) FROM outbox").fetchone()[0])


def restart(procs: FleetProcesses, name: str, *, kill: bool = True, timeout: float = 30.0) -> None:
    """Stop a daemon (SIGKILL, or SIGTERM with kill=False), start it, wait until it serves."""
    agent = procs.agents[name]
    runs = agent.log().count(SERVING_LINE)
    if kill:
        agent.kill()
    else:
        agent.stop()
    agent.start()
    deadline = time.monotonic() + timeout
    while agent.log().count(SERVING_LINE) <= runs:
        assert agent.process is not None
        assert agent.process.poll() is None, agent.log()[-3000:]
        assert time.monotonic() < deadline, f"{name} did not serve again:\n{agent.log()[-3000:]}"
        time.sleep(0.05)


def witness(procs: FleetProcesses, topic_filter: str = "vox/+/inbox/+") -> Witness:
    """Return an independent mosquitto_sub (the read-only explorer) on the fleet's broker."""
    creds = procs.broker_dir.credentials_for("explorer")
    plain = Credentials(
        username=creds.username,
        password=creds.password,
        host="127.0.0.1",
        port=procs.broker_dir.port,
    )
    return Witness(plain, topic_filter)


def witnessed(seen: Witness, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """Return the (topic, message) pairs of one type the witness saw so far."""
    found = []
    for line in list(seen.lines):
        topic, _, text = line.partition(" ")
        try:
            message = json.loads(text)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("type") == kind:
            found.append((topic, message))
    return found
