"""Real failures for multi-process liveness tests: daemons to kill or freeze, a cable to cut.

- `deploy_fleet(...)`: render the fleet's broker dir and one daemon config per agent.
- `Processes`: the `vox-agent` daemons a test started (`tests.kits.fleetproc.AgentProcess`).
- `TcpProxy`: sits between a daemon and the broker; `blackhole()` stops forwarding in both
  directions and keeps every socket open (a cut cable: no FIN, no RST), `heal()` resumes.
- `Recorder`: an independent MQTT client (the read-only explorer identity) that stamps
  every status and war-room message with the test's monotonic clock.
- `run_vox(...)`: the `vox` command as a separate process.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from tests.kits.fleetproc import REPO, AgentProcess, child_env
from tests.kits.recorder import Recorder
from vox_mqtt.broker.local import free_port
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

ANALYST = "tests.kits.agentkit:Analyst"
SLEEPER = "tests.kits.roles_for_tests:Sleeper"

# The seed's tree. spec_a also serves Sleeper's commands, so losing it changes what the
# coordinator advertises even while spec_b still serves `analyze`.
SEED_ROLES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "root": (None, ()),
    "coordinator": ("root", ()),
    "spec_a": ("coordinator", (ANALYST, SLEEPER)),
    "spec_b": ("coordinator", (ANALYST,)),
}


@dataclass
class Deployment:
    """A fleet rendered for this host: broker dir, daemon configs, the operator's config."""

    fleet: Fleet
    broker_dir: BrokerDir
    root: Path
    configs: dict[str, Path]
    operator_config: Path

    @property
    def port(self) -> int:
        return self.broker_dir.port

    def id(self, name: str) -> UUID:
        return self.fleet.agent(name).id

    def state_dir(self, name: str) -> Path:
        return self.root / "state" / name

    def conf_text(self) -> str:
        """Return the rendered mosquitto.conf."""
        return self.broker_dir.conf.read_text()

    def edit(self, name: str, **values: Any) -> Path:
        """Change keys of one daemon config (e.g. port=, disk_alert_percent=)."""
        path = self.configs[name]
        text = path.read_text()
        for key, value in values.items():
            literal = json.dumps(value)
            text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {literal}", text)
            assert count == 1, f"{key} is not a key of {path}"
        path.write_text(text)
        return path

    def recorder(self) -> Recorder:
        """Return a recorder logged in as the read-only explorer (enter it to start)."""
        creds = self.broker_dir.credentials_for("explorer")
        return Recorder(
            port=self.port,
            username=creds.username,
            password=creds.password or "",
            client_id=f"{creds.username}-recorder",
        )


def deploy_fleet(
    root: Path,
    shape: dict[str, tuple[str | None, tuple[str, ...]]] = SEED_ROLES,
    *,
    heartbeat: float = 1.0,
    keepalive: int = 5,
    lock_client_ids: bool = True,
) -> Deployment:
    """Render the broker and every agent's daemon config (and the operator's) under root."""
    ids = {name: uuid4() for name in shape}
    parts = [f'[operator]\nid = "{uuid4()}"\n']
    for name, (master, roles) in shape.items():
        lines = [f'name = "{name}"', f'id = "{ids[name]}"', f"heartbeat_interval = {heartbeat}"]
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        lines.append("roles = [" + ", ".join(f'"{r}"' for r in roles) + "]")
        parts.append("[[agents]]\n" + "\n".join(lines) + "\n")
    return deploy(
        parse_fleet("\n".join(parts)), root, keepalive=keepalive, lock_client_ids=lock_client_ids
    )


def deploy(
    fleet: Fleet, root: Path, *, keepalive: int = 5, lock_client_ids: bool = True
) -> Deployment:
    """Render a fleet's broker and every agent's daemon config (and the operator's) under root."""
    broker_dir = render_broker_dir(
        fleet,
        root / "broker",
        port=free_port(),
        explorer=True,
        run_as_user=getpass.getuser(),
        lock_client_ids=lock_client_ids,
    )
    etc = root / "etc"
    configs = {
        name: render_agent_config(
            fleet,
            name,
            broker_dir.root,
            etc / f"{name}.toml",
            root / "state" / name,
            keepalive=keepalive,
            shutdown_grace=2.0,
        ).config
        for name in (agent.name for agent in fleet)
    }
    operator = render_agent_config(
        fleet, "operator", broker_dir.root, etc / "operator.toml", root / "console"
    )
    return Deployment(
        fleet=fleet,
        broker_dir=broker_dir,
        root=root,
        configs=configs,
        operator_config=operator.config,
    )


class Processes:
    """The daemons a test started; all are killed at the end, their logs shown on failure."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: dict[str, AgentProcess] = {}

    def start(self, deployment: Deployment, names: Iterable[str] | None = None) -> None:
        for name in names if names is not None else deployment.configs:
            process = AgentProcess(
                name,
                deployment.configs[name],
                deployment.state_dir(name),
                self.logs / f"{name}.log",
            )
            process.start()
            self.started[name] = process

    def __getitem__(self, name: str) -> AgentProcess:
        return self.started[name]

    def close(self, *, show_logs: bool) -> None:
        for process in self.started.values():
            process.kill()
            if show_logs:
                print(f"\n--- {process.name} daemon log ---\n{process.log()[-6000:]}")


class TcpProxy:
    """A loopback TCP relay that can black-hole its traffic without closing anything."""

    def __init__(
        self, target_port: int, host: str = "127.0.0.1", *, receive_buffer: int | None = None
    ) -> None:
        self.target = (host, target_port)
        self.listener = socket.create_server((host, 0))
        if receive_buffer is not None:
            # Inherited by each accepted socket: once black-holed, a client's sends block
            # after its own send buffer fills, not after the kernel's 32 MB autotuned window.
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self._blackholed = threading.Event()
        self._closed = threading.Event()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._upstreams: set[socket.socket] = set()
        self._stall: list[float] = []  # [bytes to pass first, seconds to hold the rest]
        self.stalls = 0  # how many stall_downstream() holds have happened
        self.downstream_bytes = 0  # from the broker to clients, after any stall's first part
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def blackhole(self) -> None:
        """Stop forwarding in both directions; sockets stay open, nothing is refused."""
        self._blackholed.set()

    def stall_downstream(self, after_bytes: int, seconds: float) -> None:
        """Once after_bytes more have gone from the broker to clients, hold everything for
        seconds, as a starved broker or host would, then go on."""
        self._stall = [float(after_bytes), seconds]

    def heal(self) -> None:
        """Forward again, including whatever piled up meanwhile."""
        self._blackholed.clear()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for sock in list(self._pairs):
            sock.close()
        self.listener.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while not self._closed.is_set():
                if self._blackholed.is_set():
                    # Not even accept(): the kernel completes handshakes, data goes nowhere.
                    time.sleep(0.05)
                    continue
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self.listener:
                        self._accept(selector)
                    elif sock in self._pairs:
                        self._forward(selector, sock)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            selector.register(sock, selectors.EVENT_READ)
        self._pairs[client] = upstream
        self._pairs[upstream] = client
        self._upstreams.add(upstream)

    def _forward(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        peer = self._pairs[sock]
        try:
            data = sock.recv(65536)
            if data and self._stall and sock in self._upstreams:
                passed, seconds = self._stall
                if len(data) > passed:
                    self._stall = []
                    peer.sendall(data[: int(passed)])
                    self.stalls += 1
                    time.sleep(seconds)  # the whole relay stops, both ways
                    data = data[int(passed) :]
                else:
                    self._stall[0] -= len(data)
            if data:
                if sock in self._upstreams:
                    self.downstream_bytes += len(data)
                peer.sendall(data)
                return
        except OSError:
            pass
        for end in (sock, peer):
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(end)
            self._pairs.pop(end, None)
            end.close()


def run_vox(*args: str | Path, timeout: float = 40.0) -> subprocess.CompletedProcess[str]:
    """Run `vox ARGS...` as its own process and return what it printed."""
    return subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        cwd=REPO,
        check=False,
    )


def send_json(
    dep: Deployment, command: str, *, timeout: float, **params: Any
) -> tuple[int, dict[str, Any]]:
    """Run `vox send COMMAND k=v... --json` as the operator; return (exit code, answer)."""
    pairs = [f"{k}={json.dumps(v)}" for k, v in params.items()]
    out = run_vox(
        "send", "--config", dep.operator_config, command, *pairs, "--json",
        "--timeout", f"{timeout:g}",
    )  # fmt: skip
    assert out.stdout, out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return out.returncode, answer


def status_json(config: Path, *, wait: float = 3.0) -> dict[str, dict[str, Any]]:
    """Return `vox status --json` as {agent name: entry}."""
    out = run_vox("status", "--config", config, "--json", "--wait", str(wait))
    assert out.returncode == 0, out.stderr
    return {entry["name"]: entry for entry in json.loads(out.stdout)["agents"]}


def bridge_through(broker_root: Path, proxy: TcpProxy) -> None:
    """Point the bridge a site broker's directory renders at proxy (a cable to cut)."""
    bridge_conf = broker_root / "bridge" / "bridge.conf"
    text = bridge_conf.read_text()
    bridge_conf.write_text(re.sub(r"(?m)^address .*$", f"address 127.0.0.1:{proxy.port}", text))
