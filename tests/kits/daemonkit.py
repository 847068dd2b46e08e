"""One `vox-agent` daemon as a real process: its rendered config, its log, its sd_notify socket."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

from vox_mqtt.broker.local import free_port
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

REPO = Path(__file__).resolve().parents[2]
FLEET = """
[operator]
id = "{operator}"

[[agents]]
name = "root"
id = "{root}"
roles = ["tests.kits.roles_for_tests:Sleeper"]
settings = {{ colour = "blue" }}

[[agents]]
name = "leaf"
id = "{leaf}"
master_id = "{root}"
"""


@dataclass
class Deployment:
    """A fleet rendered for one host: broker dir, the root's config, the operator's config."""

    fleet: Fleet
    broker_dir: BrokerDir
    conf_text: str
    root_config: Path
    operator_config: Path
    state_dir: Path

    @property
    def port(self) -> int:
        return self.broker_dir.port

    @property
    def root_id(self) -> str:
        return str(self.fleet.root.id)

    def retained_status(self, timeout: float = 5.0, *, presence: bool = False) -> dict[str, Any]:
        """Return the root's retained status (or presence, the one that says its state:
        docs/liveness.md) as an independent client reads it."""
        out = subprocess.run(
            [*self.sub_args(presence=presence), "-C", "1", "-W", str(int(timeout))],
            capture_output=True,
            text=True,
            timeout=timeout + 5,
            check=False,
        )
        assert out.returncode == 0, f"no retained status: {out.returncode} {out.stderr}"
        details: dict[str, Any] = json.loads(out.stdout)["details"]
        return details

    def sub_args(self, *, presence: bool = False) -> list[str]:
        """Return mosquitto_sub as the read-only explorer on the root's status topic."""
        creds = self.broker_dir.credentials_for("explorer")
        return [
            "mosquitto_sub",
            *("-h", "127.0.0.1", "-p", str(self.port), "-V", "mqttv5"),
            *("-u", creds.username, "-P", creds.password, "-i", creds.username),
            *("-t", f"vox/{self.root_id}/{'presence' if presence else 'status'}"),
        ]


def deploy(tmp_path: Path, *, grace: float = 10.0) -> Deployment:
    """Render the broker, the root's daemon config and the operator's console config."""
    fleet = parse_fleet(FLEET.format(operator=uuid4(), root=uuid4(), leaf=uuid4()))
    broker_dir = render_broker_dir(
        fleet, tmp_path / "broker", port=free_port(), explorer=True, run_as_user=getpass.getuser()
    )
    etc = tmp_path / "etc"
    root = render_agent_config(
        fleet, "root", broker_dir.root, etc / "root.toml", tmp_path / "state", shutdown_grace=grace
    )
    operator = render_agent_config(
        fleet, "operator", broker_dir.root, etc / "operator.toml", tmp_path / "console"
    )
    return Deployment(
        fleet=fleet,
        broker_dir=broker_dir,
        conf_text=broker_dir.conf.read_text(),
        root_config=root.config,
        operator_config=operator.config,
        state_dir=tmp_path / "state",
    )


class NotifySocket:
    """A bound unix datagram socket that records every sd_notify datagram with its time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, list[str]]] = []
        self.on_ready: Callable[[], None] | None = None
        self.process: subprocess.Popen[bytes] | None = None  # fail fast if it exits
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            lines = data.decode().split("\n")
            if "READY=1" in lines and self.on_ready is not None:
                self.on_ready()  # before anything else: the daemon must not get further
            with self._cond:
                self.received.append((time.monotonic(), lines))
                self._cond.notify_all()

    def lines(self) -> list[str]:
        with self._cond:
            return [line for _, lines in self.received for line in lines]

    def times_of(self, line: str) -> list[float]:
        with self._cond:
            return [at for at, lines in self.received if line in lines]

    def wait_for(self, line: str, *, count: int = 1, timeout: float = 30.0) -> float:
        """Return when the count-th datagram holding line arrived; fail after timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                times = [at for at, lines in self.received if line in lines]
                if len(times) >= count:
                    return times[count - 1]
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {line!r} (x{count}) within {timeout}s: {self.received}"
                if self.process is not None:
                    code = self.process.poll()
                    assert code is None, f"the daemon exited ({code}) before {line!r}"
                self._cond.wait(min(remaining, 0.2))

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


class Daemon:
    """`python -m agent_daemon` as a child process with its log in a file."""

    def __init__(
        self,
        config: Path,
        log: Path,
        env: dict[str, str],
        *,
        prefix: Sequence[str] = (),
        python: str = sys.executable,
        cwd: Path = REPO,
    ) -> None:
        self.log_path = log
        with log.open("wb") as handle:
            self.process = subprocess.Popen(
                [*prefix, python, "-m", "agent_daemon", "--config", str(config)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.process.poll() is None, f"daemon exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"no {text!r} in the log:\n{self.log()}"
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)


def _fleet_text(roles: str = '["tests.kits.roles_for_tests:Sleeper"]', settings: str = "{}") -> str:
    root, operator = uuid4(), uuid4()
    return (
        f'[operator]\nid = "{operator}"\n\n'
        f'[[agents]]\nname = "root"\nid = "{root}"\nroles = {roles}\nsettings = {settings}\n'
    )


def render(tmp_path: Path, text: str | None = None) -> Path:
    """Render a one-agent fleet's broker dir and its root's daemon config; return the config."""
    fleet = parse_fleet(text or _fleet_text())
    broker = render_broker_dir(fleet, tmp_path / "broker", port=1, run_as_user=getpass.getuser())
    out = tmp_path / "etc" / "root.toml"
    render_agent_config(fleet, "root", broker.root, out, tmp_path / "state")
    return out
