"""One agent as a service: validate, connect with backoff, notify systemd, stop gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import random
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from vox_mqtt.agent.facade import AgentConfig, VOXAgent
from vox_mqtt.agent.roles import Role, load_role
from vox_mqtt.fleet.config import DaemonFile, load_daemon_config
from vox_mqtt.ledger.peernames import read_names, write_names
from vox_mqtt.ledger.privatefs import private_dir
from vox_mqtt.protocol.errors import (
    BrokerUnavailable,
    ConfigError,
    DeliveryFailed,
    LedgerError,
    Refused,
    SubscriptionRefused,
    VoxError,
)
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.protocol.sitelinks import LinkMap

from .health import Health, assess, status_line, write_health
from .logs import LogSetup
from .reload import plan_reload
from .sdnotify import Notifier, watchdog_interval

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "RUN_LOCK",
    "AgentDaemon",
    "Prepared",
    "daemon_running",
    "hold_early_reloads",
    "prepare",
    "state_dir_problems",
]

log = logging.getLogger("vox-agent")

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1  # a runtime failure systemd should restart (Restart=on-failure)
EXIT_CONFIG: Final = 2  # a config error; the unit says RestartPreventExitStatus=2
# The broker refused the login (credentials, not authorized, TLS): restarting cannot fix it.
# 77 is sysexits' EX_NOPERM, which systemctl shows as "status=77/NOPERMISSION".
EXIT_REFUSED: Final = 77
# Held (flock) in the state dir for the daemon's whole run: `vox-agent --check --login`
# looks at it, because a login as this agent would take over the daemon's session.
RUN_LOCK: Final = "vox-agent.lock"

# A SIGHUP taken before the event loop's own handler exists (hold_early_reloads): SIGHUP's
# default action would end the process, and the reload it asked for would be lost.
_early_reload: list[bool] = []


def hold_early_reloads() -> None:
    """Keep a SIGHUP that comes while the daemon starts; AgentDaemon.run applies it."""
    signal.signal(signal.SIGHUP, lambda _signum, _frame: _early_reload.append(True))


# Checks of the loop and the session between watchdog pings; a wedged loop misses them all.
_CHECKS_PER_PING: Final = 4
_IDLE_CHECK: Final = 5.0  # seconds between session checks when no watchdog is asked for
_SLOW_LOOP: Final = 1.0  # extra seconds of lag that get logged as a blocked event loop


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A validated daemon config: the file, the runtime config and the roles to mount."""

    path: Path
    file: DaemonFile
    config: AgentConfig
    role_specs: tuple[str, ...]
    settings: Mapping[str, Any]

    @property
    def shutdown_grace(self) -> float:
        """Return how long in-flight commands may run after SIGTERM."""
        return self.file.agent.shutdown_grace

    def new_roles(self) -> list[Role]:
        """Return fresh instances of the configured roles."""
        return [load_role(spec, self.settings) for spec in self.role_specs]


def prepare(path: Path) -> Prepared:
    """Validate the config, its credentials, roles and state dir; raise ConfigError."""
    file = load_daemon_config(path)
    config = file.agent_config(path.absolute().parent)
    try:
        # A federated fleet: `vox agent render` wrote the bridge links to watch beside it.
        config = replace(config, links=LinkMap.beside(path))
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    prepared = Prepared(
        path=path,
        file=file,
        config=config,
        role_specs=tuple(file.agent.roles),
        settings=dict(file.agent.settings),
    )
    problems: list[str] = []
    for spec in prepared.role_specs:
        try:
            load_role(spec, prepared.settings)
        except ConfigError as exc:
            problems += [f"{path}: agent.roles: {line}" for line in exc.problems]
    problems += state_dir_problems(Path(config.state_dir))
    if problems:
        raise ConfigError(problems)
    return prepared


def _read_bundle(
    path: Path, running: AgentConfig
) -> tuple[DaemonFile, BrokerSettings, LinkMap | None]:
    """Read the config on disk, the secret and the links it names: all of them, or raise."""
    fresh = load_daemon_config(path)
    base = path.absolute().parent
    secret = fresh.broker.settings(running.broker.client_id, base=base)
    if fresh.signing is not None:  # keys a rotation changed (docs/security.md)
        secret = replace(secret, signing=fresh.signing.signing(base))
    return fresh, secret, LinkMap.beside(path)


def keep_names(config: AgentConfig, *, keep_former: bool = False) -> None:
    """Keep the names this agent knows beside its ledger, for `vox ledger` views.

    After a reload former children keep their names too: the ledger still names them.
    """
    names = {config.id: config.name, **config.children}
    if config.master_id is not None:
        names[config.master_id] = config.master_name
    state_dir = Path(config.state_dir)
    former = read_names(state_dir) if keep_former else {}
    write_names(state_dir, {**former, **names})


def state_dir_problems(state_dir: Path) -> list[str]:
    """Return why the state dir cannot hold the ledger, creating it if it is missing."""
    if state_dir.exists() and not state_dir.is_dir():
        return [
            f"state dir {state_dir}: it is a file, not a folder — move the file away or point "
            "agent.state_dir elsewhere"
        ]
    try:
        private_dir(state_dir)
    except NotADirectoryError:
        return [f"state dir {state_dir}: a folder on its path is a file"]
    except OSError as exc:
        return [f"state dir {state_dir}: cannot create it: {exc.strerror}"]
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return [f"state dir {state_dir}: not writable by uid {os.getuid()}"]
    return []


def hold_run_lock(state_dir: Path) -> int | None:
    """Take the run lock and return its descriptor (None if it cannot be created).

    Raise ConfigError if another process holds it.
    """
    try:
        fd = os.open(state_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("cannot create %s: %s", state_dir / RUN_LOCK, exc.strerror)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        # Two daemons of one agent would take each other's broker session over, again and
        # again, and write one ledger: the second one stops here.
        raise ConfigError(
            [
                f"another vox-agent is running with the state dir {state_dir} (it holds "
                f"{RUN_LOCK}): one agent runs once; stop the other first (systemctl status "
                "vox-agent@NAME, or its terminal)"
            ]
        ) from None
    return fd


def daemon_running(state_dir: Path) -> bool | None:
    """Return whether a daemon holds the run lock of this state dir; None if we cannot tell."""
    try:
        # Read-only and never created: a lock file owned by this user would lock out a
        # daemon that runs as another.
        fd = os.open(state_dir / RUN_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


class AgentDaemon:
    """Run one agent until SIGTERM/SIGINT; SIGHUP reopens logs and applies new children."""

    def __init__(
        self,
        prepared: Prepared,
        *,
        logs: LogSetup | None = None,
        notifier: Notifier | None = None,
        retry_initial: float = 1.0,
        retry_max: float = 60.0,
    ) -> None:
        self.prepared = prepared
        self.logs = logs
        self.notifier = notifier or Notifier()
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.agent: VOXAgent | None = None
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._reload = asyncio.Event()
        self._built = prepared  # what the agent of the last connect attempt was built from
        self._watchdog = watchdog_interval()
        self._health: Health | None = None  # the last one told to systemd and the file

    @property
    def name(self) -> str:
        """Return the agent's name."""
        return self.prepared.config.name

    async def run(self) -> int:
        """Run the agent's whole life and return the process exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        if _early_reload:
            # Asked for while the config was read or before: the file may have changed since.
            _early_reload.clear()
            self._reload.set()
        reloader = asyncio.ensure_future(self._reload_loop())
        keep_names(self.prepared.config)
        lock: int | None = None
        try:
            lock = hold_run_lock(Path(self.prepared.config.state_dir))
            agent = await self._connect()
            if agent is None:
                log.info("stopped (%s) before the broker was reached", self._stop_reason)
                return EXIT_OK
            return await self._serve(agent)
        except ConfigError as exc:  # found only on use, e.g. an unreadable CA file
            for problem in exc.problems:
                log.error("%s", problem)
            return EXIT_CONFIG
        except Refused as exc:
            text = f"the broker refused this agent: {exc}"
            log.error(
                "%s; not retrying (exit %d): fix it, then start the agent", text, EXIT_REFUSED
            )
            self.notifier.status(text)
            return EXIT_REFUSED
        except LedgerError as exc:
            log.error("the ledger failed: %s", exc)
            return EXIT_FAILURE
        finally:
            if lock is not None:
                self._write_health(self._assess("stopped", None))  # only the lock's holder
                os.close(lock)
            reloader.cancel()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            self.notifier.close()

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Begin a graceful stop (the SIGTERM/SIGINT handler)."""
        if not self._stop.is_set():
            self._stop_reason = signal.Signals(signum).name
            self._stop.set()

    # --- start ------------------------------------------------------------------------------

    async def _connect(self) -> VOXAgent | None:
        """Open the ledger and connect, retrying with backoff; None if stopped meanwhile."""
        broker = self.prepared.config.broker
        delay = self.retry_initial
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            self._built = self.prepared
            agent = VOXAgent(self.prepared.config, self.prepared.new_roles())
            self._write_health(self._assess("starting", None))
            self.notifier.status(f"connecting to the broker at {broker.address} (try {attempt})")
            # The connect attempt itself waits up to connect_timeout.
            self.notifier.extend_timeout(broker.connect_timeout + 30)
            try:
                entered = await self._unless_stopped(agent.__aenter__())
            except (BrokerUnavailable, DeliveryFailed) as exc:
                if isinstance(exc, Refused) and not isinstance(exc, SubscriptionRefused):
                    raise  # a refused login: run() says so and exits
                # DeliveryFailed or SubscriptionRefused: the login was accepted but the ACL
                # is from an older fleet file; re-rendering the broker fixes it, so keep trying.
                wait = random.uniform(0.5, 1.0) * delay
                log.warning(
                    "cannot connect to the broker (try %d): %s; next try in %.1fs",
                    attempt,
                    exc,
                    wait,
                )
                self.notifier.status(
                    f"waiting for the broker at {broker.address} (try {attempt} failed: {exc})"
                )
                self.notifier.extend_timeout(wait + broker.connect_timeout + 30)
                delay = min(delay * 2, self.retry_max)
                await self._unless_stopped(asyncio.sleep(wait))
                continue
            if entered is None:
                return None
            return agent
        return None

    async def _unless_stopped(self, work: Any) -> Any:
        """Await work unless a stop is requested first (then cancel it and return None)."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    # --- serve ------------------------------------------------------------------------------

    async def _serve(self, agent: VOXAgent) -> int:
        self.agent = agent
        if self.prepared is not self._built:
            # A SIGHUP was taken while this agent was connecting: it changed only the config
            # for a next attempt, and this agent runs the one it was built from. Go back to
            # that one and reload against it, so the change applies live (keys, children).
            self.prepared = self._built
            self._reload.set()
        # The birth was acknowledged by the broker inside the session's on_connect, before
        # the agent counted as entered: READY=1 now means "reachable and announced".
        ready = self._ready_text(agent)
        log.info("%s", ready)
        self._health = health = self._assess("serving", agent)
        self._write_health(health)
        self.notifier.ready(status_line(health, ready))
        monitor = asyncio.ensure_future(self._monitor(agent))
        try:
            await self._stop.wait()
        finally:
            monitor.cancel()
            if not self._stop.is_set():  # not a signal: an error is on its way out
                await agent.stop(0)
        grace = self.prepared.shutdown_grace
        busy = agent.in_flight
        text = f"stopping on {self._stop_reason}: {busy} command(s) in flight, grace {grace:g}s"
        log.info("%s", text)
        self._write_health(self._assess("stopping", agent))
        self.notifier.stopping(text)
        # A grace longer than the unit's TimeoutStopSec must not be cut short.
        self.notifier.extend_timeout(grace + 15)
        connected = agent.session is not None and agent.session.connected
        await agent.stop(grace)
        if connected:
            log.info("stopped: SHUTDOWN published, ledger closed")
        else:
            log.warning("stopped while the broker was unreachable: its will stands; ledger closed")
        return EXIT_OK

    def _ready_text(self, agent: VOXAgent) -> str:
        epoch = agent.epoch
        commands = ", ".join(agent.advertised_commands()) or "none"
        return (
            f"serving {self.name} ({agent.id}) on {self.prepared.config.broker.address}, "
            f"epoch {epoch}, commands: {commands}"
        )

    def _assess(self, phase: str, agent: VOXAgent | None) -> Health:
        connected = agent is not None and agent.session is not None and agent.session.connected
        failure = None if agent is None else agent.ledger.write_failure
        broker = self.prepared.config.broker.address
        return assess(phase=phase, connected=connected, ledger_failure=failure, broker=broker)

    def _health_bound(self) -> float:
        """Return how long a health file stays true: a few of the monitor's checks."""
        timeout = self._watchdog
        tick = timeout / 2 / _CHECKS_PER_PING if timeout is not None else _IDLE_CHECK
        return round(3 * tick + 5.0, 3)

    def _write_health(self, health: Health) -> None:
        if not write_health(
            Path(self.prepared.config.state_dir), health, valid_for=self._health_bound()
        ):
            log.debug("cannot write the health file in %s", self.prepared.config.state_dir)

    def _check_health(self, agent: VOXAgent) -> None:
        """Keep the health file fresh; tell systemd's status line when the health changes."""
        health = self._assess("serving", agent)
        self._write_health(health)
        if health != self._health:
            self._health = health
            level = logging.INFO if health.ok else logging.WARNING
            log.log(level, "health: %s", health.text)
            self.notifier.status(status_line(health, self._ready_text(agent)))

    async def _monitor(self, agent: VOXAgent) -> None:
        """Ping the watchdog while the loop runs and the session is up (or only briefly down)."""
        timeout = self._watchdog
        period = timeout / 2 if timeout is not None else None
        tick = period / _CHECKS_PER_PING if period is not None else _IDLE_CHECK
        if period is not None:
            self.notifier.watchdog()
        last_ping = time.monotonic()
        down_since: float | None = None
        withheld = False
        while True:
            planned = time.monotonic() + tick
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - planned > _SLOW_LOOP:
                log.warning("the event loop was blocked for %.1fs", now - planned)
            connected = agent.session is not None and agent.session.connected
            if connected and down_since is not None:
                log.info("broker session is back after %.1fs", now - down_since)
                down_since, withheld = None, False
            elif not connected and down_since is None:
                down_since = now
            self._check_health(agent)  # connected, degraded (the ledger) or disconnected
            if timeout is None or period is None or now - last_ping < period:
                continue
            if down_since is not None and now - down_since > timeout:
                if not withheld:
                    log.error(
                        "broker session down for %.0fs (> watchdog %gs): no more watchdog "
                        "pings, so systemd restarts this agent",
                        now - down_since,
                        timeout,
                    )
                    withheld = True
                continue
            self.notifier.watchdog()
            last_ping = now

    # --- reload ---------------------------------------------------------------------------

    async def _reload_loop(self) -> None:
        while True:
            await self._reload.wait()
            self._reload.clear()
            if self.agent is None:
                await self.reload()  # still starting: READY=1 must wait for the birth
                continue
            self.notifier.reloading()
            await self.reload()
            health = self._assess("serving", self.agent)
            self.notifier.ready(status_line(health, self._ready_text(self.agent)))

    async def reload(self) -> None:
        """Reopen the log file, re-read the config, apply new children and a new secret live.

        Everything else a config says takes a restart: such a change, or an invalid file,
        is refused whole with one line, and the agent runs on as it was (docs/operations.md).
        """
        if self.logs is not None:
            self.logs.reopen()
        path = self.prepared.path
        running = self.prepared.config
        try:
            # In a thread: whatever sits at the path, the loop keeps serving (files are read
            # bounded and without blocking: vox_mqtt/protocol/boundedfile.py).
            fresh, secret, links = await asyncio.to_thread(_read_bundle, path, running)
        except (ConfigError, ValueError) as exc:
            problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            log.error(
                "SIGHUP: invalid config: %s: nothing changed, still running with the config it "
                "started",
                "; ".join(problems),
            )
            return
        plan = plan_reload(
            self.prepared.file,
            fresh,
            old_secret=running.broker.password,
            new_secret=secret.password,
        )
        if links != running.links:
            # Which children sit behind which bridge is read once, at start.
            plan = replace(plan, restart_keys=(*plan.restart_keys, "the bridge links beside it"))
        if plan.restart_keys:
            log.warning(
                "SIGHUP: %s changed (%s): restart the agent to apply it; nothing changed",
                path,
                ", ".join(plan.restart_keys),
            )
            return
        rekeyed = secret.signing != running.broker.signing
        if plan.unchanged and not rekeyed:
            log.info("SIGHUP: logs reopened; %s is valid and unchanged", path)
            return
        agent = self.agent
        if agent is None:
            # Not connected yet: the next attempt builds the agent from the new config.
            config = replace(fresh.agent_config(path.absolute().parent), links=links)
            self.prepared = replace(self.prepared, file=fresh, config=config)
            log.info("SIGHUP: the next connection attempt uses it: %s (%s)", plan.summary(), path)
            return
        change = ""
        if plan.added or plan.removed or plan.renamed or plan.master_name:
            try:
                change = await agent.update_children(
                    fresh.agent.children, master_name=fresh.agent.master_name
                )
            except SubscriptionRefused as exc:
                log.error(
                    "SIGHUP: %s: the broker does not let it watch a new child yet (%s): nothing "
                    "changed; reload the broker with the new fleet first (docs/operations.md)",
                    path,
                    exc.topic,
                )
                return
            except VoxError as exc:
                log.error("SIGHUP: %s: cannot apply it live (%s): restart the agent", path, exc)
                return
        if plan.secret_changed and secret.password is not None:
            agent.update_secret(secret.password)
            change += (
                "; " if change else ""
            ) + "a new broker secret, used from the next connection on"
        reconnects = False
        if rekeyed:
            reconnects = agent.update_signing(secret.signing)
            change += ("; " if change else "") + "new signing keys, used at once"
            if reconnects:  # its own key: the will it registered must be signed anew
                change += " (its own is new: it reconnects once, for its will)"
        self.prepared = replace(self.prepared, file=fresh, config=agent.config)
        keep_names(agent.config, keep_former=True)
        if change:
            how = "applied" if reconnects else "applied without reconnecting"
            log.info("SIGHUP: %s: %s (%s)", how, change, path)
        else:
            log.info("SIGHUP: logs reopened; %s is valid and the agent already runs it", path)
