"""`vox demo`'s local fleet: its files, a private Mosquitto and one vox-agent per agent."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from uuid import UUID

from vox_mqtt.agent.facade import AgentConfig, VOXAgent
from vox_mqtt.broker.federation import sites_fleet_toml, write_link_map
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.probe import pid_alive
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.observe.status import AgentLiveness
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.protocol.errors import ConfigError, LedgerError, VoxError
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet, seed_fleet_toml
from vox_mqtt.protocol.sites import chain_up
from vox_mqtt.protocol.topics import LIVENESS_FILTERS, WARROOM_FILTER
from vox_mqtt.transport.session import BrokerSettings

__all__ = [
    "DEMO_WATCHER",
    "DemoLayout",
    "ExplorerWatch",
    "Ledgers",
    "LocalFleet",
    "VoxRun",
    "pid_alive",
    "run_vox",
]

MARKER: Final = ".vox-demo"
WEB: Final = "web"  # `vox demo --web`: the console's process and log, beside the agents'
# The demo's own watcher: an explorer identity of its own (`explorer-demo-watcher`), so
# the `explorer` the demo offers the user is used by nobody else (docs/operations.md).
DEMO_WATCHER: Final = "explorer-demo-watcher"
_OWNED: Final = ("fleet.toml", "broker", "sites", "config", "state", "logs", "run.json")


@dataclass(frozen=True)
class DemoLayout:
    """Where a local fleet keeps its files, all under one folder."""

    root: Path

    @property
    def fleet(self) -> Path:
        """Return the fleet file."""
        return self.root / "fleet.toml"

    @property
    def broker(self) -> Path:
        """Return the rendered broker folder (mosquitto.conf, acl, passwd, credentials)."""
        return self.root / "broker"

    def site(self, name: str) -> Path:
        """Return the rendered folder of a site broker (`--sites`); the core's is `broker`."""
        return self.root / "sites" / name

    @property
    def run_file(self) -> Path:
        """Return the file that lists the processes a run started."""
        return self.root / "run.json"

    def config(self, name: str) -> Path:
        """Return the daemon config of an agent, or the operator's console config."""
        return self.root / "config" / f"{name}.toml"

    def state(self, name: str) -> Path:
        """Return an agent's state dir (its ledger is logs.db there)."""
        return self.root / "state" / name

    def log(self, name: str) -> Path:
        """Return an agent's log file."""
        return self.root / "logs" / f"{name}.log"

    def prepare(self) -> None:
        """Make the folder ready for a fresh run; refuse one that holds anything else."""
        root = self.root
        marker = root / MARKER
        if root.exists() and not root.is_dir():
            raise ConfigError([f"{root} is a file; pass --dir with a folder"])
        if marker.exists():
            running = _running_pid(self.run_file)
            if running is not None:
                raise ConfigError(
                    [f"a demo from {root} is still running (pid {running}); stop it first"]
                )
            for name in _OWNED:
                path = root / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
        elif root.exists() and any(root.iterdir()):
            raise ConfigError(
                [f"{root} is not empty and not a vox demo folder; pass --dir with a new folder"]
            )
        try:
            for folder in (root, root / "config", root / "state", root / "logs"):
                folder.mkdir(parents=True, exist_ok=True)
            marker.write_text("made by `vox demo`; its contents are replaced on every run\n")
        except OSError as exc:
            raise ConfigError([f"{root}: cannot write there: {exc.strerror or exc}"]) from None


def _running_pid(run_file: Path) -> int | None:
    """Return the pid of the demo that wrote run_file if it is still alive."""
    try:
        pid = int(json.loads(run_file.read_text())["demo_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid != os.getpid() and pid_alive(pid) else None


@dataclass
class LocalFleet:
    """Render a fleet into a layout, run its broker and daemons, and stop all of them."""

    layout: DemoLayout
    keepalive: int = 10
    shutdown_grace: float = 5.0
    sites: bool = False  # the seed over a core and two chained sites (docs/federation.md)
    fleet: Fleet | None = None
    broker_dir: BrokerDir | None = None  # the root broker's: the operator and explorers log in here
    broker: LocalBroker | None = None
    site_dirs: dict[str, BrokerDir] = field(default_factory=dict)
    site_brokers: dict[str, LocalBroker] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Every pid this run started, for run.json and for tests that check nothing is left.
    started: dict[str, list[int]] = field(default_factory=dict)
    # Added to each daemon's environment: where a bench's roles import from (PYTHONPATH).
    agent_env: dict[str, str] = field(default_factory=dict)

    def render(self, fleet_text: str | None = None) -> Fleet:
        """Write the fleet file (the seed tree by default), the broker dir and every config."""
        layout = self.layout
        layout.prepare()
        if fleet_text is None:
            fleet_text = sites_fleet_toml(seed_fleet_toml()) if self.sites else seed_fleet_toml()
        layout.fleet.write_text(fleet_text)
        fleet = self.fleet = load_fleet(layout.fleet)
        dirs = self._render_brokers(fleet)
        for name in [fleet.operator_name, *(agent.name for agent in fleet)]:
            broker = fleet.agent(name).broker if name != fleet.operator_name else None
            rendered = render_agent_config(
                fleet,
                name,
                dirs[broker or fleet.root_broker or ""].root,
                layout.config(name),
                layout.state(name),
                keepalive=self.keepalive,
                shutdown_grace=self.shutdown_grace,
            )
            write_link_map(fleet, name, rendered.config)
        self._write_run_file()
        return fleet

    def _render_brokers(self, fleet: Fleet) -> dict[str, BrokerDir]:
        """Render the broker (the root one into `broker`, sites under `sites/`), upstream first."""
        user = getpass.getuser()
        if not fleet.brokers:
            self.broker_dir = render_broker_dir(
                fleet,
                self.layout.broker,
                port=free_port(),
                explorer=True,
                explorers=(DEMO_WATCHER,),
                run_as_user=user,
            )
            return {"": self.broker_dir}
        dirs: dict[str, BrokerDir] = {}
        for spec in sorted(fleet.brokers, key=lambda b: len(list(chain_up(fleet.brokers, b.name)))):
            root = spec.upstream is None
            dirs[spec.name] = render_broker_dir(
                fleet,
                self.layout.broker if root else self.layout.site(spec.name),
                broker=spec.name,
                port=free_port(),
                upstream_dir=None if root else dirs[spec.upstream or ""].root,
                explorer=root,
                explorers=(DEMO_WATCHER,) if root else (),
                run_as_user=user,
            )
            if root:
                self.broker_dir = dirs[spec.name]
            else:
                self.site_dirs[spec.name] = dirs[spec.name]
        return dirs

    def start_broker(self) -> LocalBroker:
        """Start the private Mosquitto from the rendered config (the root broker, then sites)."""
        assert self.broker_dir is not None, "render() first"
        self.broker = LocalBroker(self.broker_dir.conf, port=self.broker_dir.port)
        self.broker.start()
        self.started.setdefault("mosquitto", []).append(self.broker.pid)
        for name, site in self.site_dirs.items():
            broker = self.site_brokers[name] = LocalBroker(site.conf, port=site.port)
            broker.start()
            self.started.setdefault(f"mosquitto-{name}", []).append(broker.pid)
        self._write_run_file()
        return self.broker

    def agent_command(self, name: str) -> list[str]:
        """Return the command line that runs an agent's daemon."""
        script = Path(sys.executable).parent / "vox-agent"
        program = [str(script)] if script.is_file() else [sys.executable, "-m", "agent_daemon"]
        return [*program, "--config", str(self.layout.config(name))]

    def start_agent(self, name: str) -> subprocess.Popen[bytes]:
        """Start (or restart) one agent's daemon, logging to its log file."""
        old = self.processes.get(name)
        if old is not None and old.poll() is None:
            raise VoxError(f"{name} is already running (pid {old.pid})")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env.update(self.agent_env)
        log_path = self.layout.log(name)
        with log_path.open("ab") as log:
            # Its own session: a Ctrl-C at the terminal reaches the demo, which stops
            # the daemons in order, not all of them at once.
            process = subprocess.Popen(
                [*self.agent_command(name), "--log-file", str(log_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.processes[name] = process
        self.started.setdefault(name, []).append(process.pid)
        self._write_run_file()
        return process

    def start_web(self) -> subprocess.Popen[bytes]:
        """Start `vox web` on the operator's config, on a free loopback port."""
        log_path = self.layout.log(WEB)
        log_path.write_bytes(b"")
        script = Path(sys.executable).parent / "vox"
        program = [str(script)] if script.is_file() else [sys.executable, "-m", "vox_mqtt.cli"]
        config = str(self.layout.config("operator"))
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [*program, "web", "--config", config, "--listen", "127.0.0.1:0"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes[WEB] = process
        self.started.setdefault(WEB, []).append(process.pid)
        self._write_run_file()
        return process

    async def web_url(self, timeout: float = 20.0) -> str:
        """Return the URL `vox web` printed once it serves; fail if it exits or takes long."""
        process = self.processes[WEB]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            for line in self.layout.log(WEB).read_text(errors="replace").splitlines():
                _, found, rest = line.partition("serving ")
                if found and rest.startswith("http://"):
                    return rest.split()[0]
            await asyncio.sleep(0.1)
        raise VoxError(f"vox web did not start: {self.log_tail(WEB)}")

    def exited(self) -> dict[str, int]:
        """Return the agents whose daemon is no longer running, with their exit codes."""
        codes = {name: process.poll() for name, process in self.processes.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def kill_agent(self, name: str) -> int:
        """SIGKILL an agent's daemon, as a crashed host would; return its pid."""
        process = self.processes[name]
        process.kill()
        process.wait(10)
        return process.pid

    def stop_agent(self, name: str, timeout: float = 15.0) -> int | None:
        """SIGTERM an agent's daemon and wait; SIGKILL its process group if it hangs."""
        process = self.processes.get(name)
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        return self._reap(process, timeout)

    def _reap(self, process: subprocess.Popen[bytes], timeout: float) -> int | None:
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
            return None

    def stop(self, timeout: float = 15.0) -> dict[str, int | None]:
        """Stop every daemon (one SIGTERM each, all at once), then the broker; return codes."""
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        # Only one SIGTERM: a daemon that is already stopping need not hear it twice.
        codes = {
            name: self._reap(process, max(0.1, deadline - time.monotonic()))
            for name, process in self.processes.items()
        }
        # A daemon's children, if it ever had any, go with its group.
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for site in reversed(list(self.site_brokers.values())):
            site.stop()
        if self.broker is not None:
            self.broker.stop()
        self._write_run_file(finished=True)
        return codes

    def __enter__(self) -> LocalFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def leftovers(self) -> list[int]:
        """Return the pids this run started that are still alive."""
        return [pid for group in self.started.values() for pid in group if pid_alive(pid)]

    def log_tail(self, name: str, lines: int = 20) -> str:
        """Return the last lines an agent logged."""
        try:
            text = self.layout.log(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _write_run_file(self, *, finished: bool = False) -> None:
        data = {
            "demo_pid": None if finished else os.getpid(),
            "port": None if self.broker_dir is None else self.broker_dir.port,
            "pids": self.started,
        }
        with contextlib.suppress(OSError):
            self.layout.run_file.write_text(json.dumps(data, indent=1) + "\n")


class ExplorerWatch:
    """Watch every status and the war room as a read-only explorer identity of its own.

    The demo's watcher is `explorer-demo-watcher`, not the `explorer` the demo offers the
    user: with client ids locked to usernames, two connections of one identity kick each
    other off, every few seconds for as long as both run (issue 38).
    """

    def __init__(self, broker_dir: BrokerDir, state_dir: Path, name: str = DEMO_WATCHER) -> None:
        creds = broker_dir.credentials_for(name)
        broker = BrokerSettings(
            host=creds.host,
            port=creds.port,
            username=creds.username,
            password=creds.password,
            client_id=creds.username,
            keepalive=10,
        )
        self.agent = VOXAgent(
            AgentConfig(
                id=UUID(creds.username),
                name=name,
                master_id=None,
                state_dir=state_dir,
                broker=replace(broker, session_expiry=0),
                publish_status=False,
                observe=(*LIVENESS_FILTERS, WARROOM_FILTER),
            )
        )

    async def __aenter__(self) -> ExplorerWatch:
        await self.agent.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.agent.__aexit__(None, None, None)

    def status(self, agent_id: UUID) -> AgentLiveness | None:
        """Return the liveness of an agent, if its status was seen."""
        return self.agent.fleet_view.get(agent_id)

    def incidents(self) -> list[Incident]:
        """Return the open war-room incidents."""
        return self.agent.incidents

    async def wait_for(
        self,
        predicate: Callable[[], object],
        *,
        what: str,
        timeout: float = 20.0,
        fleet: LocalFleet | None = None,
    ) -> float:
        """Poll until predicate() is true and return how long it took; VoxError on timeout."""
        started = time.monotonic()
        while not predicate():
            if fleet is not None and (dead := fleet.exited()):
                names = ", ".join(f"{n} (exit {c})" for n, c in dead.items())
                raise VoxError(f"while waiting for {what}: daemon(s) stopped: {names}")
            if time.monotonic() - started > timeout:
                raise VoxError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(0.05)
        return time.monotonic() - started


class Ledgers:
    """Read the agents' ledgers while their daemons write them (read-only, WAL readers)."""

    def __init__(self, layout: DemoLayout) -> None:
        self.layout = layout
        self._open: dict[str, VOXAgentMemory] = {}

    def path(self, name: str) -> Path:
        """Return an agent's ledger file."""
        return self.layout.state(name) / "logs.db"

    async def rows(self, name: str, limit: int = 1000) -> list[dict[str, Any]]:
        """Return an agent's newest rows, newest first."""
        memory = self._open.get(name)
        if memory is None:
            memory = self._open[name] = VOXAgentMemory(self.path(name), read_only=True)
        return await memory.get_recent(limit)

    async def wait_for(
        self,
        name: str,
        match: Callable[[dict[str, Any]], bool],
        *,
        what: str,
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        """Poll an agent's ledger until a row matches and return it; VoxError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for row in await self.rows(name):
                if match(row):
                    return row
            if time.monotonic() > deadline:
                raise VoxError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        """Close every ledger opened."""
        for memory in self._open.values():
            with contextlib.suppress(LedgerError):
                await memory.close()
        self._open.clear()


@dataclass(frozen=True, kw_only=True)
class VoxRun:
    """The outcome of one `vox` command."""

    args: tuple[str, ...]
    code: int
    output: str

    def json(self) -> object:
        """Return the output parsed as JSON."""
        return json.loads(self.output)


async def run_vox(args: Sequence[str], *, timeout: float = 60.0) -> VoxRun:
    """Run `vox ARGS...` as its own process, as a user would, and return its output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vox_mqtt.cli",
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")},
    )
    try:
        async with asyncio.timeout(timeout):
            output, _ = await process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return VoxRun(args=tuple(args), code=process.returncode, output=output.decode(errors="replace"))
