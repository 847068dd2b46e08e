"""The verbs' side of the operator's console: reach it over its socket, start it if need be.

Stdlib only (a minimal HTTP/1.1 client over asyncio's Unix streams): a verb that is a
client of the console pays for no MQTT, SQLite or pydantic import of its own.
Where no console runs, `reach()` starts one in the background, `vox console serve --idle
SECONDS` with the same config, logging to console.log in the operator's state dir; it stops
by itself after that many seconds without a client (docs/operations.md, "The operator's
console"). `VOX_CONSOLE=one-shot` (or a verb's `--one-shot`) skips all of this: the verb
logs in itself, when nothing else of the operator's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

from vox_mqtt.console.home.place import (
    IDLE_DEFAULT,
    LOG_NAME,
    SOCKET_NAME,
    OperatorLock,
    connectable,
)

from ._ask import CONSOLE_ENV, ask_console, one_shot_wanted

__all__ = [
    "CONSOLE_ENV",
    "IDLE_ENV",
    "ConsoleUnreachable",
    "HomeClient",
    "ask_console",
    "one_shot_wanted",
    "operator_lock",
    "reach",
    "state_dir_of",
]

IDLE_ENV: Final = "VOX_CONSOLE_IDLE"  # seconds a console a verb started stays after its last client
_START_WAIT: Final = 60.0  # seconds a verb waits for the console it started to listen
_HEADER_MAX: Final = 64 * 1024


class ConsoleUnreachable(Exception):
    """No console answers and none could be started: the one line says why."""


def state_dir_of(config: Path) -> Path:
    """Return the operator's state dir as its console config names it."""
    from vox_mqtt.fleet.config import load_console_config

    op = load_console_config(config).operator
    state = op.state_dir.expanduser()
    return state if state.is_absolute() else config.absolute().parent / state


class HomeClient:
    """HTTP/1.1 over the console's Unix socket, one connection per call."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._address = connectable(socket_path)

    async def _open(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(self._address, limit=_HEADER_MAX * 16)
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: console\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split()
        if len(parts) < 2 or not parts[1].isdigit():
            writer.close()
            raise ConsoleUnreachable(f"the console at {self.socket_path} answered no HTTP")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers, reader, writer

    async def _chunks(
        self, headers: dict[str, str], reader: asyncio.StreamReader
    ) -> AsyncIterator[bytes]:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                if not size_line:
                    return
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await reader.readexactly(size)
                await reader.readline()  # the CRLF after each chunk
                yield chunk
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            yield await reader.read()

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Send one request; return its status and JSON body."""
        status, headers, reader, writer = await self._open(method, path, body)
        try:
            data = b"".join([chunk async for chunk in self._chunks(headers, reader)])
        finally:
            writer.close()
        try:
            found = json.loads(data or b"{}")
        except ValueError:
            found = {"error": data.decode(errors="replace")[:200]}
        return status, found if isinstance(found, dict) else {"data": found}

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST and yield each JSON line of the answer as it comes (NDJSON)."""
        status, headers, reader, writer = await self._open("POST", path, body)
        try:
            if status != 200:
                data = b"".join([chunk async for chunk in self._chunks(headers, reader)])
                with contextlib.suppress(ValueError):
                    found = json.loads(data)
                    if isinstance(found, dict):
                        yield {"kind": "refused", "status": status, **found}
                        return
                yield {"kind": "refused", "status": status, "error": data.decode(errors="replace")}
                return
            pending = b""
            async for chunk in self._chunks(headers, reader):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            writer.close()

    async def hello(self) -> dict[str, Any] | None:
        """Return the console's hello, or None when nothing answers on the socket."""
        try:
            status, found = await self.call("GET", "/v1/hello")
        except (OSError, ConsoleUnreachable, asyncio.IncompleteReadError):
            return None
        return found if status == 200 else None


def _idle() -> float:
    text = os.environ.get(IDLE_ENV, "").strip()
    try:
        return float(text) if text else IDLE_DEFAULT
    except ValueError:
        return IDLE_DEFAULT


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


async def reach(config: Path, *, start: bool = True) -> HomeClient:
    """Return a client of the operator's console, starting one if none answers and `start`.

    Raise ConsoleUnreachable (one line: why) when none answers and none could be started.
    """
    state_dir = state_dir_of(config)
    client = HomeClient(state_dir / SOCKET_NAME)
    if await client.hello() is not None:
        return client
    if not start:
        raise ConsoleUnreachable(f"no console answers on {client.socket_path}")
    lock = OperatorLock(state_dir)
    log = state_dir / LOG_NAME
    from vox_mqtt.ledger.privatefs import private_dir

    private_dir(state_dir)
    # The console takes the operator lock itself: two verbs starting one at once leave one
    # console, the other exits saying so, and both verbs reach the one that listens.
    with log.open("ab") as out:
        os.chmod(log, 0o600)
        process = subprocess.Popen(  # noqa: ASYNC220 (it returns at once: nothing is awaited)
            [
                sys.executable, "-m", "vox_mqtt.cli", "console", "serve",
                "--config", str(config.absolute()), "--idle", f"{_idle():g}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no Ctrl-C of the verb's terminal reaches it
            cwd="/",
        )  # fmt: skip
    deadline = time.monotonic() + _START_WAIT
    while time.monotonic() < deadline:
        if await client.hello() is not None:
            return client
        code = process.poll()
        if code is not None and not lock.held():
            # It ended, and no other console holds the lock: it could not start.
            why = _last_line(log).removeprefix("vox console: ") or f"exit status {code}"
            raise ConsoleUnreachable(f"could not start the operator's console: {why} (log {log})")
        await asyncio.sleep(0.05)
    raise ConsoleUnreachable(
        f"the operator's console did not listen on {client.socket_path} within "
        f"{_START_WAIT:g}s (log {log})"
    )


@contextlib.contextmanager
def operator_lock(config: Path) -> Iterator[None]:
    """Hold the operator lock for a `--one-shot` verb; ConfigError (one line) if a console runs.

    The console holds the same lock for its whole life: so a one-shot verb never logs in
    beside it, nor beside another one-shot verb (docs/operations.md).
    """
    from vox_mqtt.ledger.privatefs import private_dir
    from vox_mqtt.protocol.errors import ConfigError

    state_dir = state_dir_of(config)
    if state_dir.exists() and not state_dir.is_dir():
        yield  # OperatorConsole says what is wrong with it, in its words
        return
    private_dir(state_dir)
    lock = OperatorLock(state_dir)
    if not lock.acquire():
        raise ConfigError(
            [
                f"another process is the operator now (pid {lock.holder() or '?'}): drop "
                f"--one-shot to go through the console, or stop it (`vox console stop`)"
            ]
        )
    try:
        yield
    finally:
        lock.release()
