"""A whole fleet as real processes: rendered broker, one `vox-agent` daemon per agent."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet

REPO = Path(__file__).resolve().parents[2]


def fleet_text(
    shape: Mapping[str, str | None],
    *,
    roles: Mapping[str, list[str]] | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    heartbeat: float = 1.0,
) -> str:
    """Return a fleet file for {name: master name or None}, with roles and settings."""
    ids = {name: uuid4() for name in shape}
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n']
    for name, master in shape.items():
        lines = [f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"']
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        if roles and name in roles:
            lines.append("roles = [" + ", ".join(f'"{r}"' for r in roles[name]) + "]")
        lines.append(f"heartbeat_interval = {heartbeat}")
        if settings and name in settings:
            lines.append("[agents.settings]")
            lines += [f"{k} = {v!r}" for k, v in settings[name].items()]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts).replace("'", '"')


def child_env() -> dict[str, str]:
    """Return the environment for a daemon or `vox` child: this repo importable, no systemd."""
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = str(REPO)
    return env


@dataclass
class AgentProcess:
    """One `python -m agent_daemon` child with its log file."""

    name: str
    config: Path
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # What `python -m` runs and what it adds to child_env(): a test's launcher may wrap the daemon.
    module: str = "agent_daemon"
    env: Mapping[str, str] = field(default_factory=dict)

    def start(self) -> None:
        """Start (or restart) the daemon; the log is appended to."""
        if self.process is not None:
            self.kill()  # reap the previous run, whatever signal ended it
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env() | dict(self.env),
                cwd=REPO,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, signum: int) -> None:
        """Send a signal to the daemon."""
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL the daemon and reap it, as a crashed host would."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the daemon and wait for it; SIGKILL if it does not stop."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def log(self) -> str:
        """Return what the daemon logged."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class FleetProcesses:
    """A broker and the daemons of one fleet on this machine."""

    root: Path
    fleet: Fleet
    broker_dir: BrokerDir
    broker: LocalBroker
    operator_config: Path
    agents: dict[str, AgentProcess] = field(default_factory=dict)

    def start_all(self) -> None:
        """Start every daemon, leaves first."""
        order = sorted(
            self.agents.values(), key=lambda a: -self.fleet.depth_of(self.fleet.agent(a.name).id)
        )
        for agent in order:
            agent.start()

    def stop_all(self) -> None:
        """Stop every daemon and the broker."""
        for agent in self.agents.values():
            agent.stop()
        self.broker.stop()

    def logs(self) -> str:
        """Return every daemon's log and the broker's, for a failing test."""
        parts = [f"--- {a.name} ---\n{a.log()}" for a in self.agents.values()]
        parts.append(f"--- mosquitto ---\n{self.broker.log_tail(60)}")
        return "\n".join(parts)

    def ledger(self, name: str) -> Path:
        """Return the path of an agent's ledger."""
        return self.agents[name].state_dir / "logs.db"


@contextlib.contextmanager
def run_fleet(
    tmp: Path,
    fleet_toml: str,
    *,
    keepalive: int = 5,
    start: bool = True,
    before_broker: Callable[[BrokerDir], None] | None = None,
) -> Iterator[FleetProcesses]:
    """Render and run a fleet; stop everything and print the logs if the test fails.

    before_broker(broker_dir) may change the rendered broker files before it starts.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "fleet.toml").write_text(fleet_toml)
    fleet = load_fleet(tmp / "fleet.toml")
    broker_dir = render_broker_dir(
        fleet, tmp / "broker", port=free_port(), explorer=True, run_as_user=getpass.getuser()
    )
    if before_broker is not None:
        before_broker(broker_dir)
    broker = LocalBroker(broker_dir.conf, port=broker_dir.port)
    broker.start()
    etc = tmp / "etc"
    operator = render_agent_config(
        fleet,
        fleet.operator_name,
        broker_dir.root,
        etc / "operator.toml",
        tmp / "state" / "operator",
    )
    procs = FleetProcesses(
        root=tmp, fleet=fleet, broker_dir=broker_dir, broker=broker, operator_config=operator.config
    )
    for spec in fleet:
        state = tmp / "state" / spec.name
        rendered = render_agent_config(
            fleet, spec.name, broker_dir.root, etc / f"{spec.name}.toml", state, keepalive=keepalive
        )
        procs.agents[spec.name] = AgentProcess(
            spec.name, rendered.config, state, tmp / f"{spec.name}.log"
        )
    try:
        if start:
            procs.start_all()
        yield procs
    except BaseException:
        procs.stop_all()
        print(procs.logs())
        raise
    else:
        procs.stop_all()


def wait_until(predicate: Any, timeout: float = 20.0, what: str = "condition") -> float:
    """Poll predicate() until true and return the seconds it took; fail after timeout."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


async def wait_for_route(console: OperatorConsole, command: str, timeout: float = 30) -> None:
    """Wait until the root advertises the command: the tree below it is up."""
    async with asyncio.timeout(timeout):
        while True:
            root = console.view.get(console.root_id)
            if root is not None and root.healthy and command in root.commands:
                return
            await asyncio.sleep(0.05)


def stop(process: subprocess.Popen[Any], *, grace: float) -> None:
    """Terminate a process still running; kill it if it has not ended after grace seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextlib.contextmanager
def serving_vox(
    args: list[str], log_path: Path, ready: Callable[[str], str | None], what: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Run `vox ARGS` (a server verb) until ready(its log) gives its URL; stop it after."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "vox_mqtt.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 30
        while (url := ready(log_path.read_text())) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield process, url
    finally:
        stop(process, grace=15)
