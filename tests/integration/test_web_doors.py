"""The HTTP doors of `vox web` and `vox exporter` under attack, over a real signed fleet
(docs/security.md, F27, F28 and F29).

F27: a request whose Host names another site (a DNS rebinding) is refused before anything
is served, on 127.0.0.1, [::1] and 127.0.0.2; the door's own address and the names given
with --allowed-host are served. F28: without the token no note is served, sealed or not;
with it, the note opens. F29: 1,100 half-open connections against a server whose descriptor
limit is systemd's 1024 leave a legitimate request served and the server's stderr small.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kits.fleetproc import (
    REPO,
    FleetProcesses,
    child_env,
    fleet_text,
    run_fleet,
    serving_vox,
    stop,
    wait_for_route,
    wait_until,
)
from tests.kits.webkit import self_signed
from vox_mqtt.console.operator import OperatorConsole

pytestmark = pytest.mark.slow

SHAPE = {"root": None, "specialist": "root"}
ROLES = {"root": ["tests.kits.webroles:Notifier"], "specialist": ["tests.kits.agentkit:Analyst"]}
NOTE = "Subject: Translation\n\nClient: Netwire, ana@netwire.example"
REBIND = "rebind.attacker.example"
FLOOD = 1100
SYSTEMD_NOFILE = 1024  # the soft descriptor limit a systemd service starts with
STDERR_BOUND = 8 * 1024  # bytes the server may print under the flood, start lines included


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcesses]:
    """A signed fleet whose root told the operator of a job with a sealed note."""
    text = 'signatures = "require"\n' + fleet_text(SHAPE, roles=ROLES, heartbeat=1.0)
    with run_fleet(tmp_path_factory.mktemp("webdoors") / "fleet", text) as procs:

        async def tell() -> None:
            async with OperatorConsole(procs.operator_config) as console:
                await wait_for_route(console, "tell", timeout=60)
                await console.send_command("tell", {"note": NOTE, "source": "mail"}, wait=30)
                await asyncio.to_thread(
                    wait_until,
                    lambda: "vox-sealed:1:" in _read(console.inbox_path),
                    30,
                    "the sealed note in the operator's inbox",
                )

        asyncio.run(tell())
        yield procs


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@dataclass
class Door:
    """A serving `vox web` or `vox exporter`: where, and what it printed."""

    process: subprocess.Popen[bytes]
    host: str  # as in a URL: an IPv6 address in brackets
    port: int
    log_path: Path
    token: str | None = None
    tls: ssl.SSLContext | None = None  # what a client trusts when it serves HTTPS

    def ask(self, path: str, host: str | None = None, *, timeout: float = 10) -> tuple[int, bytes]:
        """GET path with this Host header (the door's own address by default)."""
        address = self.host.strip("[]")
        connection = (
            http.client.HTTPConnection(address, self.port, timeout=timeout)
            if self.tls is None
            else http.client.HTTPSConnection(address, self.port, timeout=timeout, context=self.tls)
        )
        headers = {"Host": host if host is not None else f"{self.host}:{self.port}"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


@contextlib.contextmanager
def serving(verb: str, config: Path, listen: str, log_path: Path, *extra: str) -> Iterator[Door]:
    """Run `vox web` or `vox exporter` on listen (port 0) until the test ends."""
    pattern = r"serving (https?://\S+/)" if verb == "web" else r"serving (http://\S+/)metrics"

    def ready(log: str) -> str | None:
        found = re.search(pattern, log)
        if found is None or ("--generate-token" in extra and "?token=" not in log):
            return None
        return found.group(1)

    args = [verb, "--config", str(config), "--listen", listen, *extra]
    with serving_vox(args, log_path, ready, f"vox {verb}") as (process, url):
        parts = urllib.parse.urlsplit(url)
        assert parts.port is not None
        token = re.search(r"\?token=(\S+)", log_path.read_text())
        yield Door(
            process=process,
            host=parts.netloc.rpartition(":")[0],
            port=parts.port,
            log_path=log_path,
            token=None if token is None else token.group(1),
        )


CSRF = re.compile(rb'name="vox-csrf" content="([0-9a-f]{64})"')


@pytest.mark.parametrize("address", ["127.0.0.1", "[::1]", "127.0.0.2"])
def test_a_rebound_name_is_refused_and_the_doors_own_address_served(
    fleet: FleetProcesses, tmp_path: Path, address: str
) -> None:
    config = fleet.operator_config
    named = ("--allowed-host", "console.example.org")
    with (
        serving("web", config, f"{address}:0", tmp_path / "web.log", *named) as web,
        serving("exporter", config, f"{address}:0", tmp_path / "exporter.log", *named) as exp,
    ):
        assert web.host == address  # --listen 127.0.0.2:P serves there (it was refused)
        for door, paths in ((web, ("/", "/api/inbox", "/api/snapshot")), (exp, ("/metrics",))):
            for path in (*paths, "/health"):
                for host in (REBIND, f"{REBIND}:{door.port}", "", "console.example.org.evil"):
                    status, body = door.ask(path, host)
                    assert status == 421, (door.host, path, host, status, body[:200])
                    assert CSRF.search(body) is None
                    assert b"entries" not in body
                    assert b"vox_agent_up" not in body
        status, page = web.ask("/")
        assert status == 200
        assert CSRF.search(page) is not None  # the page, with its CSRF token
        for host in (f"console.example.org:{web.port}", "localhost", f"localhost:{web.port}"):
            assert web.ask("/api/snapshot", host)[0] == 200, host
        status, body = exp.ask("/metrics")
        assert status == 200
        assert b"vox_agent_up" in body
        assert b'vox_exporter_http_connections_closed_total{reason="wrong_host"} 8' in body
        assert exp.ask("/health", f"console.example.org:{exp.port}")[0] == 200
        for log in (web.log_path, exp.log_path):
            assert "Traceback" not in log.read_text()


def test_an_allowed_host_with_a_port_is_refused_in_one_line(tmp_path: Path) -> None:
    for verb in ("web", "exporter"):
        done = subprocess.run(
            [sys.executable, "-m", "vox_mqtt.cli", verb, "--allowed-host", "a.example:80"],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert "--allowed-host 'a.example:80'" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_note_is_opened_only_for_a_request_with_the_token(
    fleet: FleetProcesses, tmp_path: Path
) -> None:
    config = fleet.operator_config
    with serving("web", config, "127.0.0.1:0", tmp_path / "open.log") as web:
        status, body = web.ask("/api/inbox")
        assert status == 200
        (job,) = json.loads(body)["entries"]
        assert job["note"] is None
        assert job["sealed"].startswith("sealed: start vox web with a token")
        assert b"Netwire" not in body
        assert b"vox-sealed" not in body
    log = tmp_path / "token.log"
    with serving("web", config, "127.0.0.1:0", log, "--generate-token") as web:
        assert web.token is not None
        status, body = web.ask("/api/inbox")
        assert status == 200
        (job,) = json.loads(body)["entries"]
        assert (job["note"], job["sealed"]) == (NOTE, None)
        web.token = None
        assert web.ask("/api/inbox")[0] == 401


# --- F29 -------------------------------------------------------------------------------


def _systemd_nofile() -> None:
    """In the server child: the soft descriptor limit of a systemd service."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SYSTEMD_NOFILE, hard))


@contextlib.contextmanager
def limited(verb: str, config: Path, log_path: Path, *extra: str) -> Iterator[Door]:
    """Run the verb on 127.0.0.1 with systemd's descriptor limit, stderr alone in log_path."""
    args = [verb, "--config", str(config), "--listen", "127.0.0.1:0", *extra]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "vox_mqtt.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            cwd=REPO,
            preexec_fn=_systemd_nofile,
        )
    try:
        pattern = r"serving https?://127\.0\.0\.1:(\d+)/"
        wait_until(
            lambda: re.search(pattern, log_path.read_text()) or process.poll() is not None,
            30,
            f"vox {verb} serving",
        )
        found = re.search(pattern, log_path.read_text())
        assert found, log_path.read_text()
        yield Door(process=process, host="127.0.0.1", port=int(found.group(1)), log_path=log_path)
    finally:
        stop(process, grace=15)


class Flood:
    """Hold FLOOD connections that each sent half a request line, reopening any closed."""

    def __init__(self, port: int, payload: bytes) -> None:
        self.port = port
        self.payload = payload
        self.sockets: list[socket.socket] = []
        self.opened = 0
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def _open(self) -> None:
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(self.payload)
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self.sockets.append(sock)
        self.opened += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            kept = []
            for sock in self.sockets:
                try:
                    gone = sock.recv(4096) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.closed_by_server += 1
                    sock.close()
                else:
                    kept.append(sock)
            self.sockets = kept
            while len(self.sockets) < FLOOD and not self._stop.is_set():
                self._open()
            self._stop.wait(0.2)

    def __enter__(self) -> Flood:
        self._thread.start()
        wait_until(lambda: self.opened >= FLOOD, 120, f"{FLOOD} half-open connections")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for sock in self.sockets:
            sock.close()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """Let this test process hold the flood (its soft limit raised up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * FLOOD
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard descriptor limit {hard} is below {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@dataclass
class Figures:
    served_in: list[float]
    stderr_bytes: int
    threads: int
    cpu_seconds: float
    opened: int
    closed_by_server: int


HALF_A_REQUEST = b"GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
HALF_A_HELLO = b"\x16\x03\x01\x02\x00\x01\x00"  # a TLS ClientHello's first bytes


def _under_flood(
    door: Door, path: str, ok: Callable[[int, bytes], bool], payload: bytes = HALF_A_REQUEST
) -> Figures:
    threads_before = _threads(door.process.pid)
    cpu_before = _cpu_seconds(door.process.pid)
    with Flood(door.port, payload) as flood:
        time.sleep(2)  # the flood held a while: past a sweep, the cap reached
        served_in = []
        for _ in range(3):
            started = time.monotonic()
            status, body = door.ask(path, timeout=10)
            served_in.append(round(time.monotonic() - started, 3))
            assert ok(status, body), (status, body[:300])
        threads = max(_threads(door.process.pid), threads_before)
        cpu = _cpu_seconds(door.process.pid) - cpu_before
        assert door.process.poll() is None
        figures = Figures(
            served_in=served_in,
            stderr_bytes=door.log_path.stat().st_size,
            threads=threads,
            cpu_seconds=round(cpu, 2),
            opened=flood.opened,
            closed_by_server=flood.closed_by_server,
        )
    print(f"F29 {door.log_path.stem}: {figures}")
    return figures


def _check(figures: Figures, log: str) -> None:
    # Served within 2 s (docs/security.md, F29): once at least, out of three tries (each
    # bounded at 10 s), so that a loaded test machine does not make it flaky. Before the
    # door, each try timed out.
    assert min(figures.served_in) < 2.0, figures
    assert figures.stderr_bytes < STDERR_BOUND, log[-2000:]
    assert "Traceback" not in log
    assert "out of system resource" not in log
    assert figures.threads < 40, figures  # no thread per connection


def test_half_open_connections_leave_the_console_serving(
    fleet: FleetProcesses, tmp_path: Path, many_descriptors: None
) -> None:
    with limited("web", fleet.operator_config, tmp_path / "web-stderr.log") as web:
        figures = _under_flood(web, "/api/snapshot", lambda s, b: s == 200 and b'"top"' in b)
        _check(figures, web.log_path.read_text())


def test_half_open_tls_handshakes_leave_the_console_serving(
    fleet: FleetProcesses, tmp_path: Path, many_descriptors: None
) -> None:
    cert, key, trusted = self_signed(tmp_path)
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    with limited("web", fleet.operator_config, tmp_path / "tls-stderr.log", *tls) as web:
        web.tls = trusted
        figures = _under_flood(
            web, "/api/snapshot", lambda s, b: s == 200 and b'"top"' in b, HALF_A_HELLO
        )
        _check(figures, web.log_path.read_text())


def test_half_open_connections_leave_the_exporter_serving(
    fleet: FleetProcesses, tmp_path: Path, many_descriptors: None
) -> None:
    with limited("exporter", fleet.operator_config, tmp_path / "exporter-stderr.log") as exp:
        figures = _under_flood(exp, "/health", lambda s, b: s == 200 and b'"ok"' in b)
        _check(figures, exp.log_path.read_text())
        status, body = exp.ask("/metrics")
        assert status == 200
        closed = re.findall(
            rb'vox_exporter_http_connections_closed_total\{reason="(\w+)"\} (\d+)', body
        )
        counted = {k.decode(): int(v) for k, v in closed}
        # The flood was counted: closed to make room (or timed out), never a traceback.
        assert counted["evicted"] + counted["timed_out"] >= FLOOD - 256, counted
