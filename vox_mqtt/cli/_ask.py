"""One question to a running operator's console, at the cost of a few stdlib modules.

`vox status`, `warroom`, `inbox` and `request show` ask the console their one question over
its Unix socket (HTTP/1.1, one connection) with a blocking socket: no asyncio, no MQTT, no
pydantic (docs/architecture.md, "The command line"). The socket is found from the console
config's `[operator] state_dir` read with tomllib; where that does not go (no such file, no
such key), or no console answers there, the verb takes its longer way: cli/_home.py (which
starts a console when none runs) or a look of its own.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from vox_mqtt.console.home.place import SOCKET_NAME, connectable

__all__ = [
    "CONSOLE_ENV",
    "Answer",
    "ask",
    "ask_console",
    "ask_running",
    "one_shot_env",
    "one_shot_wanted",
    "quick_state_dir",
    "waiting_note",
]

Answer = tuple[int, dict[str, Any]]
CONSOLE_ENV: Final = "VOX_CONSOLE"  # "one-shot": every verb logs in itself (docs/operations.md)
_HEADER_MAX: Final = 64 * 1024
# After this long without the console's answer, a verb says what it waits for (issue item 4).
SAY_AFTER: Final = 1.0


def quick_state_dir(config: Path) -> Path | None:
    """Return the state dir a console config names, read without validating it; None if not.

    The same place `state_dir_of` (cli/_home.py) finds once the config is validated: a
    relative state_dir is taken from the config file's folder. Only to find a running
    console's socket: the console that answers there validated its config when it started.
    """
    try:
        with config.open("rb") as file:
            data = tomllib.load(file)
    except (OSError, ValueError):
        return None
    operator = data.get("operator") if data.get("kind") == "operator" else None
    state = operator.get("state_dir") if isinstance(operator, dict) else None
    if not isinstance(state, str) or not state or "\0" in state:
        return None
    path = Path(state).expanduser()
    return path if path.is_absolute() else config.absolute().parent / path


def waiting_note(what: str) -> Callable[[], None]:
    """Return what a verb prints on stderr when its answer is a second late."""

    def say() -> None:
        print(f"vox: waiting for {what} ...", file=sys.stderr, flush=True)

    return say


def _read_answer(sock: socket.socket, late: Callable[[], None] | None) -> bytes:
    """Read the whole answer (the console closes the connection after it)."""
    chunks: list[bytes] = []
    if late is not None:
        sock.settimeout(SAY_AFTER)
        try:
            first = sock.recv(65536)
        except TimeoutError:
            late()
        else:
            if not first:
                return b""
            chunks.append(first)
        sock.settimeout(None)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _body_of(head: bytes, rest: bytes) -> bytes:
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2 :]
        return body
    if "content-length" in headers:
        return rest[: int(headers["content-length"])]
    return rest


def ask(
    socket_path: Path,
    path: str,
    body: dict[str, Any] | None,
    *,
    late: Callable[[], None] | None = None,
) -> Answer:
    """POST one JSON body to the console (GET when body is None); its status and answer.

    OSError when nothing listens on the socket (or it hung up); `late` is called once if
    no byte of the answer came within SAY_AFTER seconds.
    """
    data = b"" if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: console\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(connectable(socket_path))
        sock.sendall(head.encode() + data)
        answer = _read_answer(sock, late)
    header, found, rest = answer.partition(b"\r\n\r\n")
    status_line = header.split(b"\r\n", 1)[0].decode("latin-1").split()
    if not found or len(header) > _HEADER_MAX or len(status_line) < 2:
        raise ConnectionError(f"the console at {socket_path} answered no HTTP")
    if not status_line[1].isdigit():
        raise ConnectionError(f"the console at {socket_path} answered no HTTP")
    content = _body_of(header, rest)
    try:
        parsed = json.loads(content or b"{}")
    except ValueError:
        parsed = {"error": content.decode(errors="replace")[:200]}
    return int(status_line[1]), parsed if isinstance(parsed, dict) else {"data": parsed}


def ask_running(
    config: Path, path: str, body: dict[str, Any] | None, *, late: Callable[[], None] | None = None
) -> Answer | None:
    """Ask the console that runs for this config; None when none answers on its socket."""
    state_dir = quick_state_dir(config)
    if state_dir is None:
        return None
    try:
        return ask(state_dir / SOCKET_NAME, path, body, late=late)
    except OSError:
        return None


def one_shot_wanted(flag: bool) -> bool:
    """Return whether a verb runs in-process: `--one-shot`, or VOX_CONSOLE=one-shot."""
    return flag or one_shot_env()


def one_shot_env() -> bool:
    """Return whether VOX_CONSOLE=one-shot asks every verb to run in-process."""
    return os.environ.get(CONSOLE_ENV, "").strip().lower() in ("one-shot", "oneshot", "off")


def ask_console(
    config_arg: Path | None,
    path: str,
    body: dict[str, Any],
    *,
    late: Callable[[], None] | None = None,
) -> dict[str, Any] | None:
    """Ask the operator's console, when one runs for this config; None to look in-process.

    A look of one's own is no operator login (looks.py): no console is started for it.
    With the operator's config and a console running, its live view answers at once
    (docs/operations.md, "The operator's console").
    """
    from vox_mqtt.protocol.errors import ConfigError

    from ._common import config_path

    if one_shot_env():
        return None
    try:
        config = config_path(config_arg)
    except ConfigError:
        return None
    found = ask_running(config, path, body, late=late)
    if found is None or found[0] != 200:
        return None
    return found[1]
