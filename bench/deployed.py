"""The VOX side of figures 1-3 as deployed: each agent in its own `vox-agent` process.

Every agent's daemon config is rendered with `render_agent_config` from the bench's fleet and
broker directory, as `vox agent render` writes it for a host; the daemon loads its roles from
the fleet file ("bench.voxside:Ping"), and the bench's ledger_sync is written into the config's
[agent] table. Each daemon runs as `python -m agent_daemon --config FILE` in the state dir
its agent had in the all-in-one layout (bench/common.py `agent_config`): the same agent on the
same host, restarted as a daemon, so its epoch moves on and its master believes the new
session. The operator stays an in-process VOXAgent (the load generator), as in the all-in-one
layout. Ready means the operator's own view of the root: ACTIVE and advertising
every command of the started agents (what the all-in-one side waits for too).

Every daemon is stopped (SIGTERM, then SIGKILL) and reaped when its block ends, whatever ended
it; each also gets SIGTERM from the kernel if this process dies first (`setpriv --pdeathsig`,
which execs the daemon, so the pid measured is the daemon's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.common import BenchBroker
from bench.report import REPO
from bench.voxside import LEDGER_SYNC_ENV, SEED_ROLES
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.roles import Role
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.fleet.config import DaemonFile

READY_TIMEOUT = 60.0  # daemons importing on a loaded 2-core machine
STOP_TIMEOUT = 20.0


@dataclass
class AgentProcess:
    """One running `vox-agent` daemon of the bench, with its config, state dir and log."""

    name: str
    config: Path
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        """Return the daemon's process id."""
        return self.process.pid

    @property
    def ledger(self) -> Path:
        """Return the path of the daemon's ledger."""
        return self.state_dir / "logs.db"

    def log_tail(self, lines: int = 30) -> str:
        """Return the end of the daemon's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_running(self) -> None:
        """Raise with the end of its log if the daemon has exited."""
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"the {self.name} daemon exited ({code}); its log ({self.log_path}):\n"
                f"{self.log_tail()}"
            )


def daemon_env() -> dict[str, str]:
    """Return a daemon's environment: this repository importable (the roles), no systemd."""
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = str(REPO)
    return env


def with_ledger_sync(text: str, ledger_sync: str) -> str:
    """Return a rendered daemon config with `ledger_sync` set in its [agent] table."""
    line = f"ledger_sync = {json.dumps(ledger_sync)}"
    head, marker, rest = text.partition("\n[agent]\n")
    if not marker:
        raise ValueError("the rendered daemon config has no [agent] table")
    table, next_table, tail = rest.partition("\n[")
    if re.search(r"^ledger_sync\s*=", table, flags=re.MULTILINE):
        table = re.sub(r"^ledger_sync\s*=.*$", line, table, count=1, flags=re.MULTILINE)
    else:
        table = f"{line}\n{table}"
    return head + marker + table + next_table + tail


def render_config(bench: BenchBroker, name: str, folder: Path, ledger_sync: str) -> Path:
    """Render `name`'s daemon config under folder/etc with the bench's ledger_sync."""
    state = bench.agent_config(name).state_dir
    rendered = render_agent_config(
        bench.fleet, name, bench.root, folder / "etc" / f"{name}.toml", state
    )
    path = rendered.config
    text = with_ledger_sync(path.read_text(encoding="utf-8"), ledger_sync)
    path.write_text(text, encoding="utf-8")  # keeps the rendered file's mode
    loaded = DaemonFile.model_validate(tomllib.loads(text))  # what the daemon will read
    if loaded.agent.ledger_sync != ledger_sync:
        raise ValueError(f"{path}: ledger_sync {loaded.agent.ledger_sync!r}, not {ledger_sync!r}")
    return path


def _prefix() -> list[str]:
    """Return the command that makes a daemon die with this process, where there is one."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


def stop_all(daemons: Iterable[AgentProcess], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM every daemon at once, wait for them together, SIGKILL what is left; reap all."""
    daemons = list(daemons)
    for daemon in daemons:
        if daemon.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                daemon.process.terminate()
    deadline = time.monotonic() + timeout
    for daemon in daemons:
        try:
            daemon.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                daemon.process.kill()
            daemon.process.wait(10)


@contextlib.contextmanager
def run_daemons(
    bench: BenchBroker, names: Iterable[str], *, ledger_sync: str, folder: Path | None = None
) -> Iterator[dict[str, AgentProcess]]:
    """Render and start one daemon per named agent; stop and reap them all on the way out."""
    folder = folder or bench.workdir / "deployed"
    prefix = _prefix()
    daemons: dict[str, AgentProcess] = {}
    try:
        for name in names:
            config = render_config(bench, name, folder, ledger_sync)
            log_path = folder / f"{name}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [*prefix, sys.executable, "-m", "agent_daemon", "--config", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=daemon_env(),
                    cwd=REPO,
                    start_new_session=True,  # a ^C reaches the bench, which stops them in turn
                )
            state = bench.agent_config(name).state_dir
            daemons[name] = AgentProcess(name, config, state, log_path, process)
        yield daemons
    finally:
        stop_all(daemons.values())


def role_commands(names: Iterable[str], roles: Mapping[str, tuple[type[Role], ...]]) -> set[str]:
    """Return the commands the named agents' roles serve."""
    return {c for n in names for cls in roles.get(n, ()) for c in cls().get_commands()}


async def wait_ready(
    operator: VOXAgent,
    bench: BenchBroker,
    wanted: set[str],
    daemons: Mapping[str, AgentProcess],
    timeout: float = READY_TIMEOUT,
) -> None:
    """Wait until the operator sees the root ACTIVE advertising `wanted`; fail if one exits."""
    root = bench.fleet.root.id
    try:
        async with asyncio.timeout(timeout):
            while True:
                seen = operator.fleet_view.get(root)
                if seen is not None and seen.healthy and wanted <= set(seen.commands):
                    return
                for daemon in daemons.values():
                    daemon.check_running()
                await asyncio.sleep(0.05)
    except TimeoutError:
        seen = operator.fleet_view.get(root)
        logs = "\n".join(f"--- {d.name} ---\n{d.log_tail(10)}" for d in daemons.values())
        raise RuntimeError(
            f"the root did not advertise {sorted(wanted)} within {timeout:g}s "
            f"(the operator sees {seen.as_dict() if seen else 'nothing'}):\n{logs}"
        ) from None


async def start_deployed(
    stack: AsyncExitStack,
    bench: BenchBroker,
    names: Iterable[str],
    roles: Mapping[str, tuple[type[Role], ...]] = SEED_ROLES,
    **operator_overrides: Any,
) -> tuple[VOXAgent, dict[str, AgentProcess]]:
    """Start one daemon per named agent and the in-process operator; wait until routes are known.

    The daemons serve the roles the fleet file names; `roles` only says which commands to
    wait for (the fleet of figures 1-3 names SEED_ROLES, bench.voxside.seed_role_specs).
    """
    names = list(names)
    ledger_sync = os.environ.get(LEDGER_SYNC_ENV, "full")
    operator_overrides.setdefault("ledger_sync", ledger_sync)
    daemons = stack.enter_context(run_daemons(bench, names, ledger_sync=ledger_sync))
    operator = await stack.enter_async_context(
        VOXAgent(bench.operator_config(**operator_overrides))
    )
    await wait_ready(operator, bench, role_commands(names, roles), daemons)
    return operator, daemons


def cpu_seconds(pids: Iterable[int]) -> float:
    """Return the CPU seconds (user + system) the processes have used so far."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total
