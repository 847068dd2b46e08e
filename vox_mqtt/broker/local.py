"""A private Mosquitto on loopback, for tests, `vox demo` and benchmarks."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from vox_mqtt.protocol.errors import BrokerUnavailable

__all__ = ["LocalBroker", "find_mosquitto", "free_port", "wait_for_port"]


def find_mosquitto() -> str:
    """Return the path of the mosquitto binary; raise BrokerUnavailable saying how to get it."""
    for candidate in (
        shutil.which("mosquitto"),
        "/usr/sbin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BrokerUnavailable(
        "mosquitto is not installed: run `apt-get install mosquitto mosquitto-clients` "
        "(as root), or `make test`, which does it for you"
    )


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    Picked below the kernel's ephemeral range, so that no outgoing connection on this
    machine is handed it as its own local port before a broker binds it: a broker a test
    stops and starts again re-binds the same port, and on a busy machine a port from the
    ephemeral range was often taken by then ("Address already in use").
    """
    low = _ephemeral_low()
    for _ in range(500):
        port = random.randint(max(1024, low - _BELOW_EPHEMERAL), low - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _reserve(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # every port below the range is taken: any free one
        found: int = sock.getsockname()[1]
        return found


_BELOW_EPHEMERAL = 12_000  # how many ports under the ephemeral range free_port picks from
# A port handed out stays this process's, and is not handed out again by any process of this
# user for this long: free between the check and the broker's bind, it was once handed to two
# brokers at once, by two calls of one deployment or by two test workers ("Address already in
# use" at a federation's start, seen under load).
_RESERVED_FOR = 300.0
_HANDED: set[int] = set()


def _reserve(port: int) -> bool:
    """Reserve a port for this process (a file per port in a private temp dir); False if
    this or another process of this user took it within _RESERVED_FOR seconds."""
    if port in _HANDED:
        return False
    _HANDED.add(port)
    folder = Path(tempfile.gettempdir()) / f"vox-mqtt-ports-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        marker = folder / str(port)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            if time.time() - marker.stat().st_mtime < _RESERVED_FOR:
                return False
            os.utime(marker)  # an old reservation: this process's now
    except OSError:
        pass  # no reservation to be had: the bind check alone, as before
    return True


def _ephemeral_low() -> int:
    """Return the first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > 2048 else 32768


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Return True once host:port accepts a TCP connection, False after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


class LocalBroker:
    """Own one Mosquitto process started from a rendered config directory."""

    def __init__(self, conf_path: Path, *, port: int, host: str = "127.0.0.1") -> None:
        self.conf_path = Path(conf_path)
        self.port = port
        self.host = host
        self.log_path = self.conf_path.parent / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """Return the broker's process id."""
        if self._process is None:
            raise BrokerUnavailable("the broker is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """Return whether the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start mosquitto and wait until it accepts connections."""
        binary = find_mosquitto()
        log = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                [binary, "-c", str(self.conf_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerUnavailable(
                    f"mosquitto exited with code {self._process.returncode}:\n{self.log_tail()}"
                )
            if wait_for_port(self.host, self.port, 0.1):
                return
        self.stop()
        raise BrokerUnavailable(
            f"mosquitto did not listen on {self.host}:{self.port} within {timeout}s:\n"
            f"{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop mosquitto (SIGTERM, then SIGKILL) and reap it."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def kill(self) -> None:
        """Kill mosquitto with SIGKILL, as a crash would."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
            self._process = None

    def restart(self, timeout: float = 10.0) -> None:
        """Stop and start the broker on the same port, keeping its persistence."""
        self.stop()
        self.start(timeout)

    def reload(self) -> None:
        """Send SIGHUP so mosquitto re-reads its password and ACL files."""
        os.kill(self.pid, signal.SIGHUP)

    def log_text(self) -> str:
        """Return everything the broker has logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        """Return the last lines of the broker's log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
