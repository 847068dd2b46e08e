"""`vox console serve`: the one process that is the operator (docs/operations.md).

It enters the operator's `OperatorConsole` once (the operator's MQTT session, ledger,
inbox and sealing key), reads the fleet's liveness and war room through the operator's
read-only `_watch` look as `vox web` does (a throw-away client id: it takes nobody's
session), and serves:

- on a Unix socket in the operator's state dir (0600 in the 0700 dir, each peer's uid
  checked with SO_PEERCRED): the CLI's API (`/v1/...`, `home/api.py`) and, under the same
  paths as the browser's, the web console's own API (`build_app`);
- with `--web HOST:PORT`, the web console on TCP, sending through the same session.

It stops on SIGTERM/SIGINT, on `POST /v1/stop` (`vox console stop`), when its socket file
is removed or replaced (its state dir went away), and, with `idle`, that many seconds after
its last client (a console a verb started, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from vox_mqtt.console.doors import DoorCounters, DoorLimits, door_config, host_rule
from vox_mqtt.console.home.api import Home, HomeParts, build_home_app
from vox_mqtt.console.home.place import (
    SOCKET_NAME,
    OperatorLock,
    connectable,
    idle_expired,
    peer_allowed,
    peer_uid,
)
from vox_mqtt.console.operator import WATCH_FILTERS, OperatorConsole
from vox_mqtt.console.web import Hub, Sender, build_app
from vox_mqtt.console.web_operator import OperatorPages
from vox_mqtt.console.web_state import RESOLVED_FILE, WebState
from vox_mqtt.ledger.privatefs import private_dir
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol.errors import ConfigError, Refused
from vox_mqtt.transport.session import Inbound

__all__ = ["ServeOptions", "ServeParts", "serve"]

_log = logging.getLogger("vox_mqtt.console.home")
_PREFIX: Final = "vox console: "
_TICK: Final = 1.0  # seconds between two looks at the idle clock and the socket file


@dataclass
class ServeOptions:
    """What `vox console serve` was asked for."""

    config: Path
    socket: Path | None = None  # default: console.sock in the operator's state dir
    web: tuple[str, int] | None = None
    web_token: str | None = None
    tls: tuple[Path, Path] | None = None
    idle: float | None = None  # None: until stopped (systemd, a person's own `serve`)
    a2a: tuple[str, int] | None = None  # the A2A door (console/home/a2a.py, docs/a2a.md)
    a2a_token: str | None = None
    say: Callable[[str], None] = field(default=lambda text: _say(text))


@dataclass(frozen=True)
class ServeParts:
    """What the CLI layer lends the console (cli/console.py): this layer imports no CLI."""

    # The operator's `_watch` look as `vox web` loads it: its top, names and links; the
    # console reads through the operator's own session, never as this look.
    reader: Any
    pages: OperatorPages | None  # the web console's inbox and requests pages
    follow_pages: Callable[[OperatorPages, Hub], Awaitable[None]]  # tell the page of changes
    sender_of: Callable[[OperatorConsole], Sender]  # the page's send form, as the operator
    home: HomeParts


def _say(text: str) -> None:
    print(f"{_PREFIX}{text}", file=sys.stderr, flush=True)


class _Activity:
    """The clients in flight on either door and when the last one came or went."""

    def __init__(self) -> None:
        self.clients = 0
        self.last = time.monotonic()

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            self.clients += 1
            self.last = time.monotonic()
            try:
                await app(scope, receive, send)
            finally:
                self.clients -= 1
                self.last = time.monotonic()

        return counted


class _PeerCheckedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol that hangs up on a peer of another user (SO_PEERCRED)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        uid = None if sock is None else peer_uid(sock)
        if not peer_allowed(uid, os.getuid()):
            # The socket's mode keeps other users out already; this is the second check.
            _log.warning("refused a client of uid %s on the console's socket", uid)
            transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: the console handles the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        self.should_exit = True


def _bind_unix(path: Path) -> tuple[socket.socket, int]:
    """Bind the console's socket, 0600, replacing a stale one; return it and its inode.

    Only the holder of the operator lock calls this, so a socket file left here is a dead
    console's.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The umask makes it 0600 from its first instant: no window in which another user connects.
    old = os.umask(0o177)
    try:
        sock.bind(connectable(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock, path.stat().st_ino


def _socket_gone(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino != inode
    except OSError:
        return True


def _uvicorn(app: ASGIApp, *, peer_checked: bool, tls: tuple[Path, Path] | None) -> _Server:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        server_header=False,
        http=_PeerCheckedH11 if peer_checked else "h11",
        ssl_certfile=None if tls is None else str(tls[0]),
        ssl_keyfile=None if tls is None else str(tls[1]),
    )
    return _Server(config)


async def serve(options: ServeOptions, load: Callable[[], ServeParts]) -> int:
    """Be the operator until stopped; return the exit code (2: refused to start).

    `load` is called once the operator lock is held.
    """
    say = options.say
    console = OperatorConsole(options.config, observe=WATCH_FILTERS)
    state_dir = console.inbox_path.parent
    private_dir(state_dir)
    sock_path = options.socket or state_dir / SOCKET_NAME
    lock = OperatorLock(state_dir)
    if not lock.acquire():
        say(
            f"the operator's console already runs (pid {lock.holder() or '?'}, lock "
            f"{lock.path}): `vox console stop --config {options.config}` stops it"
        )
        return 2
    listener = None
    try:
        if options.web is not None:
            # Before the login: a port in use is said at once, in one line, exit 2.
            host, port = options.web
            try:
                listener = socket.create_server(
                    (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
                )
            except OSError as exc:
                say(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
                return 2
        return await _run(options, console, load(), sock_path, listener)
    finally:
        if listener is not None:
            listener.close()
        lock.release()


def _tap(console: OperatorConsole, state: WebState) -> None:
    """Show the web state every status and war-room message the operator's session brings.

    The console's live view rides on the operator's own session (subscribed to every
    status, presence and war-room topic: `WATCH_FILTERS`), not on a look of its own: a look
    logs in as the `_watch` identity, whose client id the broker locks to that username, and
    would take the session of any other look of it (docs/broker.md). The agent offers no
    public tap of its inbound statuses, so its dispatcher's `observed` hook
    (agent/inbound.py) is wrapped: the agent's own liveness still takes each message first.
    """
    pipeline = console.agent._inbound
    observed = pipeline.observed

    async def both(inbound: Inbound, topic: Any) -> None:
        await observed(inbound, topic)
        state.take(inbound)

    pipeline.observed = both


async def _run(
    options: ServeOptions,
    console: OperatorConsole,
    parts: ServeParts,
    sock_path: Path,
    listener: socket.socket | None,
) -> int:
    say = options.say
    reader, pages = parts.reader, parts.pages
    observer = FleetObserver(stale_after=reader.stale_after, signing=reader.broker.signing)
    state = WebState(
        observer,
        top=reader.top,
        top_name=reader.top_name,
        links=reader.link_watch(),
        resolved_file=console.inbox_path.with_name(RESOLVED_FILE),
    )
    hub = Hub(state)
    _tap(console, state)
    session = console.agent.session

    async def linked() -> None:
        # The operator's session is the console's one link to the broker (docs/web.md).
        was = None
        while True:
            up = session.connected
            if up != was:
                state.link(up)
                was = up
            await asyncio.sleep(0.5)

    stopping = asyncio.Event()
    activity = _Activity()
    try:
        async with console:
            sender = parts.sender_of(console)
            home = Home(console, state, parts.home, stop=stopping.set, activity=activity)
            # Behind the peer-checked Unix socket: no Host to check (no browser reaches it).
            web_api = build_app(hub, sender=sender, operator=pages, allowed_hosts=None)
            local = _uvicorn(
                activity.wrap(build_home_app(home, web_api)), peer_checked=True, tls=None
            )
            sock, inode = _bind_unix(sock_path)
            servers = [local]
            serving = [asyncio.ensure_future(local.serve(sockets=[sock]))]
            if options.web is not None:
                host, _port = options.web
                assert listener is not None
                web_app = build_app(
                    hub,
                    token=options.web_token,
                    sender=sender,
                    allowed_hosts=None,  # the door checks the Host first (below)
                    operator=pages,
                    secure=options.tls is not None,
                )
                # The same bounded door as `vox web` (docs/security.md, F27 and F29).
                web = _Server(
                    door_config(
                        activity.wrap(web_app),
                        rule=host_rule(host),
                        limits=DoorLimits(),
                        counters=DoorCounters(),
                        say=say,
                        tls=None
                        if options.tls is None
                        else (str(options.tls[0]), str(options.tls[1])),
                    )
                )
                servers.append(web)
                serving.append(asyncio.ensure_future(web.serve(sockets=[listener])))
                shown = f"[{host}]" if ":" in host else host
                url = f"{'http' if options.tls is None else 'https'}://{shown}:{listener.getsockname()[1]}/"
                say(f"serving {url} for the operator; commands may be sent")
                if options.web_token is not None:
                    say(f"open {url}?token={options.web_token}")
            if options.a2a is not None:
                from .a2a import a2a_app

                host, port = options.a2a
                door = socket.create_server(
                    (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
                )
                # Accepted sockets inherit it: without, a keep-alive client waited ~40 ms
                # per call for a delayed ACK (docs/a2a.md, "Cost").
                door.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                shown = f"[{host}]" if ":" in host else host
                url = f"http://{shown}:{door.getsockname()[1]}/"
                app, _close = a2a_app(console, state, url, options.a2a_token, pages)
                servers.append(_uvicorn(activity.wrap(app), peer_checked=False, tls=None))
                serving.append(asyncio.ensure_future(servers[-1].serve(sockets=[door])))
                say(f"serving A2A at {url} (card: {url}.well-known/agent-card.json)")
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stopping.set)
            idle = (
                "" if options.idle is None else f"; stops {options.idle:g}s after its last client"
            )
            say(f"the operator's console, pid {os.getpid()}, listening on {sock_path}{idle}")
            tasks = [
                asyncio.ensure_future(linked()),
                asyncio.ensure_future(hub.run(stopping.is_set)),
            ]
            if pages is not None:
                tasks.append(asyncio.ensure_future(parts.follow_pages(pages, hub)))
            try:
                while not stopping.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), _TICK)
                    if idle_expired(
                        options.idle, activity.clients, activity.last, time.monotonic()
                    ):
                        say(f"no client for {options.idle:g}s: stopping")
                        break
                    if _socket_gone(sock_path, inode):
                        # Its state dir was removed or another console took the path over:
                        # nobody can reach this one any more (gpg-agent does the same).
                        say(f"{sock_path} is gone: stopping")
                        break
                    if any(task.done() for task in serving):
                        break
            finally:
                hub.close()
                for server in servers:
                    server.stop()
                await asyncio.gather(*serving, return_exceptions=True)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if pages is not None:
                    await pages.close()
                with contextlib.suppress(OSError):
                    if not _socket_gone(sock_path, inode):
                        sock_path.unlink()
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
    except ConfigError as exc:
        for problem in exc.problems:
            say(problem)
        return 2
    except Refused as exc:
        say(str(exc))
        return 2
    say("stopped")
    return 0
