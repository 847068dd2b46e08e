"""The HTTP doors of `vox web` and `vox exporter`: which Host they answer, and how many
connections they hold and for how long (docs/security.md, F27 and F29).

Host (F27). A page on another site can make a browser reach a loopback console by rebinding
its own name to 127.0.0.1: the request then says `Host: rebind.attacker.example`. A door
answers only a Host that names its own listen address (an IPv6 one in brackets, with or
without a port), `localhost` on a loopback or wildcard address, any IP literal on a wildcard
address (a rebinding needs a name), or a name given with `--allowed-host`. The port is not
compared: an SSH tunnel (`ssh -L 9999:127.0.0.1:8080`) shows the browser's own port.

Connections (F29). uvicorn holds a connection until its client sends a whole request head,
for as long as the client likes, and its `limit_concurrency` answers 503 to every request
once reached, the legitimate one included; a flood of half-open connections then also runs
the process out of file descriptors, and asyncio logs each failed accept. So the door's
protocol (uvicorn's h11 protocol, subclassed) keeps its own count: at most
`max_connections` open; a new one past it closes the oldest connection that has no request
in flight (a half-open one, or an idle keep-alive one), or is itself refused when every one
has a request in flight; a connection that has not sent its whole request head within
`header_timeout` seconds (from its opening or the end of its last response) is closed, and
so is one whose body is still coming after `body_timeout`. Every such close is counted
(`DoorCounters`), never logged one by one; a failed accept is counted the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import resource
import ssl
import time
from asyncio import sslproto
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DoorCounters",
    "DoorLimits",
    "DoorServer",
    "HostGuard",
    "HostRule",
    "check_allowed_host",
    "connection_cap",
    "door_config",
    "expired",
    "host_of",
    "host_rule",
    "victim",
]

DEFAULT_MAX_CONNECTIONS: Final = 256
HEADER_TIMEOUT: Final = 10.0  # seconds to send a whole request head
BODY_TIMEOUT: Final = 30.0  # seconds to send a whole request body (a POST is 64 KiB at most)
KEEP_ALIVE: Final = 5  # seconds an idle keep-alive connection is kept (uvicorn's own timer)
MAX_HEAD: Final = 16 * 1024  # bytes of a request head (h11's limit, set explicitly)
BACKLOG: Final = 128  # connections the kernel queues before the server accepts them
_RESERVED_FDS: Final = 64  # descriptors left for the broker link, the ledger, the logs
_SWEEP: Final = 0.5  # seconds between two looks at the connections' timers
_REPORT_EVERY: Final = 60.0  # at most one summary line a minute on stderr
_ACCEPT_FAILED: Final = "socket.accept() out of system resource"
# uvicorn's per-connection warnings: counted, not printed (a flood would fill the journal).
_QUIET: Final = ("Invalid HTTP request received.", "Exceeded concurrency limit.")
_NAME: Final = re.compile(r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.?)+$")
_WILDCARD: Final = (ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::"))


# --- Host (F27) -------------------------------------------------------------------------


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def host_of(header: str) -> str | None:
    """Return the host a Host header names, lower-cased, without port or brackets (an IP
    literal in its normal form), or None when it is not a well-formed host[:port]."""
    text = header.strip().lower()
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not re.fullmatch(r":[0-9]{1,5}", rest)):
            return None
        ip = _ip(inside)
        return None if ip is None or ip.version != 6 else str(ip)
    name, colon, port = text.partition(":")
    if colon and not re.fullmatch(r"[0-9]{1,5}", port):
        return None  # a bare IPv6 address, or a port that is not one
    ip = _ip(name)
    if ip is not None:
        return str(ip)
    name = name.removesuffix(".")
    return name if name and _NAME.match(name) else None


def check_allowed_host(name: str) -> str:
    """Return an `--allowed-host` value in its normal form; raise ValueError saying why not."""
    text = name.strip()
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    ip = _ip(inner)
    if ip is not None:
        return str(ip)
    found = None if ":" in text else host_of(text)
    if found is None:
        raise ValueError(
            f"--allowed-host {name!r}: give a host name or an IP address, without a port "
            "(e.g. console.example.org)"
        )
    return found


@dataclass(frozen=True)
class HostRule:
    """Which Host headers a door answers (docs/security.md, F27)."""

    listen: str  # the listen address as given (an IP literal or a name)
    names: frozenset[str] = frozenset()  # --allowed-host, in their normal form

    def allows(self, header: str | None) -> bool:
        """Return whether a request with this Host header (None: none) is answered."""
        if header is None:
            return False  # every browser sends one: a request without it is no browser's
        host = host_of(header)
        if host is None:
            return False
        if host in self.names:
            return True
        listen = self.listen.lower()
        listen_ip = _ip(listen.strip("[]"))
        wildcard = listen_ip in _WILDCARD
        loopback = listen == "localhost" or (listen_ip is not None and listen_ip.is_loopback)
        asked = _ip(host)
        if asked is not None:
            if wildcard:
                return True  # an IP literal is no rebinding: that address reached this one
            if listen == "localhost":
                return asked.is_loopback
            return asked == listen_ip
        if host == "localhost":
            return loopback or wildcard
        return listen_ip is None and host == listen.removesuffix(".")


def host_rule(listen: str, names: Iterable[str] = ()) -> HostRule:
    """Return the rule of a door listening on listen with these --allowed-host names."""
    return HostRule(listen=listen, names=frozenset(check_allowed_host(n) for n in names))


class HostGuard:
    """Answer 421 to a request whose Host the rule does not allow, before anything else."""

    def __init__(self, app: ASGIApp, rule: HostRule | None, counters: DoorCounters | None) -> None:
        self.app = app
        self.rule = rule
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.rule is None:
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        # Two Host headers are no browser's either (RFC 9112, 3.2: answer 400).
        header = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if self.rule.allows(header):
            await self.app(scope, receive, send)
            return
        if self.counters is not None:
            self.counters.wrong_host += 1
        body = (
            b"421: this server answers only for its own address or the names given with "
            b"--allowed-host (docs/security.md, F27)\n"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 421,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"no-store"),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# --- Connections (F29) ------------------------------------------------------------------


@dataclass(frozen=True)
class DoorLimits:
    """How many connections a door holds and for how long (docs/security.md, F29)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT


def connection_cap(wanted: int, soft_fd_limit: int) -> int:
    """Return how many connections a door may hold under this descriptor limit.

    The kernel's backlog is accepted in one go before a connection can be closed, and the
    process needs descriptors of its own: both are kept out of the limit.
    """
    if soft_fd_limit == resource.RLIM_INFINITY or soft_fd_limit <= 0:
        return wanted
    return max(8, min(wanted, soft_fd_limit - BACKLOG - _RESERVED_FDS))


def victim(busy: Sequence[bool], cap: int) -> int | None:
    """Return which open connection to close so that a new one fits, or None.

    busy lists the open connections oldest first (True: a request in flight). Under the cap
    nothing is closed (None, and the new one is kept); at the cap the oldest one without a
    request in flight goes; when every one has a request in flight, the new one is refused
    (-1).
    """
    if len(busy) < cap:
        return None
    return next((index for index, flight in enumerate(busy) if not flight), -1)


def expired(now: float, since: float, busy: bool, body_pending: bool, limits: DoorLimits) -> bool:
    """Return whether a connection has waited too long for its client.

    since is when it opened or last finished a response (no request in flight), or when its
    request head came (one in flight). A connection without a request in flight has
    header_timeout to send a whole head; one in flight whose body is still coming has
    body_timeout; one in flight with its whole body (an event stream) never expires here.
    """
    if not busy:
        return now - since > limits.header_timeout
    return body_pending and now - since > limits.body_timeout


@dataclass
class DoorCounters:
    """What a door refused or closed, counted (docs/security.md, F29)."""

    open: int = 0
    accepted: int = 0
    refused: int = 0  # at the cap with every connection busy: the new one closed
    evicted: int = 0  # closed to make room for a new one
    timed_out: int = 0  # no whole head (or body) in time
    invalid: int = 0  # not HTTP: answered 400 by uvicorn
    accept_failed: int = 0  # accept() found no descriptor left
    wrong_host: int = 0  # answered 421 (F27)

    def closed(self) -> dict[str, int]:
        """Return the closes and refusals by reason, for a metric or a log line."""
        return {
            "refused": self.refused,
            "evicted": self.evicted,
            "timed_out": self.timed_out,
            "invalid": self.invalid,
            "accept_failed": self.accept_failed,
            "wrong_host": self.wrong_host,
        }

    def exposition(self, prefix: str) -> bytes:
        """Return the counters as Prometheus text: prefix_open and prefix_closed_total."""
        lines = [
            f"# HELP {prefix}_open HTTP connections open now.",
            f"# TYPE {prefix}_open gauge",
            f"{prefix}_open {self.open}",
            f"# HELP {prefix}_closed_total HTTP connections closed or refused by the door, "
            "by reason (docs/security.md, F29).",
            f"# TYPE {prefix}_closed_total counter",
            *(f'{prefix}_closed_total{{reason="{k}"}} {v}' for k, v in self.closed().items()),
        ]
        return ("\n".join(lines) + "\n").encode()


class _Counted(Protocol):
    """A connection as its door's keeper sees it."""

    loop: asyncio.AbstractEventLoop

    @property
    def since(self) -> float: ...

    @property
    def busy(self) -> bool: ...

    @property
    def body_pending(self) -> bool: ...

    def drop(self) -> None: ...


@dataclass
class _Doorkeeper:
    """The open connections of one door, oldest first, and their timers."""

    limits: DoorLimits
    counters: DoorCounters
    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    cap: int = DEFAULT_MAX_CONNECTIONS
    open: dict[_Counted, None] = field(default_factory=dict)  # insertion order: age
    _sweeping: asyncio.TimerHandle | None = None
    _reported: dict[str, int] = field(default_factory=dict)
    _reported_at: float = 0.0

    def admit(self, door: _Counted) -> bool:
        """Take a new connection in, closing another to make room; False: refuse it."""
        doors = list(self.open)
        chosen = victim([d.busy for d in doors], self.cap)
        if chosen == -1:
            self.counters.refused += 1
            return False
        if chosen is not None:
            self.counters.evicted += 1
            doors[chosen].drop()
        self.open[door] = None
        self.counters.accepted += 1
        self.counters.open = len(self.open)
        if self._sweeping is None:
            self._sweeping = door.loop.call_later(_SWEEP, self._sweep, door.loop)
        return True

    def gone(self, door: _Counted) -> None:
        self.open.pop(door, None)
        self.counters.open = len(self.open)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = self.clock()
        for door in list(self.open):
            if expired(now, door.since, door.busy, door.body_pending, self.limits):
                self.counters.timed_out += 1
                door.drop()
        self._report(now)
        self._sweeping = loop.call_later(_SWEEP, self._sweep, loop) if self.open else None

    def _report(self, now: float) -> None:
        """Say once a minute at most how many connections were closed or refused, and why."""
        if now - self._reported_at < _REPORT_EVERY:
            return
        closed = self.counters.closed()
        new = {k: v - self._reported.get(k, 0) for k, v in closed.items()}
        if not any(new.values()):
            return
        self._reported, self._reported_at = closed, now
        parts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in new.items() if v)
        self.say(
            f"HTTP connections closed or refused since the last report: {parts} "
            f"({len(self.open)} open, at most {self.cap}; docs/security.md, F29)"
        )

    def accept_failed(
        self, loop: asyncio.AbstractEventLoop, context: dict[str, Any], previous: Any
    ) -> None:
        """The loop's exception handler: a failed accept is counted, anything else shown."""
        if context.get("message") == _ACCEPT_FAILED:
            self.counters.accept_failed += 1
            self._report(self.clock())
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)


class _DoorProtocol(H11Protocol):
    """uvicorn's h11 protocol, counted by its door's keeper (set on a subclass per door)."""

    keeper: _Doorkeeper
    counted = True  # False inside a _TlsDoor: the TLS connection is counted, from its accept

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.since = self.keeper.clock()
        self._seen: object = None
        if self.counted and not self.keeper.admit(self):
            transport.close()  # never served: uvicorn's protocol is not told of it
            self.transport = None  # type: ignore[assignment]
            return
        super().connection_made(transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.keeper.gone(self)
        if self.transport is not None:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen and not cycle.response_complete:
            self._seen, self.since = cycle, self.keeper.clock()  # a new head came: in flight

    def on_response_complete(self) -> None:
        self.since = self.keeper.clock()
        super().on_response_complete()

    @property
    def busy(self) -> bool:
        """Whether a request is in flight (its head came, its response has not ended)."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    @property
    def body_pending(self) -> bool:
        cycle = self.cycle
        return cycle is not None and cycle.more_body

    def drop(self) -> None:
        """Close the connection now, whatever it was doing."""
        self.keeper.gone(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()  # no lingering close: the descriptor is freed at once


class _TlsDoor(asyncio.BufferedProtocol):
    """A TLS connection, counted from its accept, its handshake within the head's time.

    uvicorn hands TLS to asyncio, whose handshake takes up to 60 s before the HTTP protocol
    sees the connection: a flood of silent TLS connections would hold every descriptor. So
    the door does TLS itself: asyncio's TLS protocol between the socket and the counted
    h11 protocol, this one counted from the accept (docs/security.md, F29).
    """

    keeper: _Doorkeeper
    context: ssl.SSLContext
    inner_class: type[_DoorProtocol]

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.loop = _loop or asyncio.get_event_loop()
        self.inner = self.inner_class(
            config=config, server_state=server_state, app_state=app_state, _loop=_loop
        )
        self.inner.counted = False
        self.tls = sslproto.SSLProtocol(
            self.loop,
            self.inner,
            self.context,
            # No waiter: one would hold each failed handshake's error, "never retrieved".
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=max(1, int(self.keeper.limits.header_timeout)),
        )
        self.raw: asyncio.BaseTransport | None = None
        self.accepted = self.keeper.clock()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.accepted = self.keeper.clock()
        if not self.keeper.admit(self):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.raw = transport
        self.tls.connection_made(transport)

    def get_buffer(self, sizehint: int) -> Any:
        return self.tls.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.tls.buffer_updated(nbytes)

    def eof_received(self) -> bool | None:
        # It may return True (keep the socket open while the app reads): pass it on.
        return self.tls.eof_received()  # type: ignore[func-returns-value]

    def connection_lost(self, exc: Exception | None) -> None:
        self.keeper.gone(self)
        if self.raw is not None:
            self.tls.connection_lost(exc)

    def pause_writing(self) -> None:
        self.tls.pause_writing()

    def resume_writing(self) -> None:
        self.tls.resume_writing()

    @property
    def _connected(self) -> bool:
        return self.inner.transport is not None  # the handshake is done

    @property
    def since(self) -> float:
        return self.inner.since if self._connected else self.accepted

    @property
    def busy(self) -> bool:
        return self._connected and self.inner.busy

    @property
    def body_pending(self) -> bool:
        return self._connected and self.inner.body_pending

    def drop(self) -> None:
        """Close the connection now, its handshake done or not."""
        self.keeper.gone(self)
        if self.raw is not None and not self.raw.is_closing():
            self.raw.abort()  # type: ignore[attr-defined]


class _Quiet(logging.Filter):
    """Count uvicorn's per-connection warnings instead of printing them."""

    def __init__(self, counters: DoorCounters) -> None:
        super().__init__()
        self.counters = counters

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() in _QUIET:
            self.counters.invalid += 1
            return False
        return True


def door_config(
    app: ASGIApp,
    *,
    rule: HostRule | None,
    limits: DoorLimits,
    counters: DoorCounters,
    say: Callable[[str], None],
    tls: tuple[str, str] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> uvicorn.Config:
    """Return uvicorn's config for a door: the app behind its Host guard, on the bounded
    protocol, with keep-alive, head size and backlog set (docs/security.md, F27 and F29).

    Call it on the loop that will serve: a failed accept on that loop is counted.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    keeper = _Doorkeeper(
        limits=limits, counters=counters, say=say, cap=connection_cap(limits.max_connections, soft)
    )
    protocol: type[asyncio.Protocol] = type("DoorProtocol", (_DoorProtocol,), {"keeper": keeper})
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # what uvicorn makes of the files
        context.load_cert_chain(tls[0], tls[1])
        attributes = {"keeper": keeper, "context": context, "inner_class": protocol}
        # A buffered protocol where uvicorn names a plain one: asyncio takes either.
        protocol = cast(type[asyncio.Protocol], type("TlsDoorProtocol", (_TlsDoor,), attributes))
    running = loop or asyncio.get_running_loop()
    previous = running.get_exception_handler()
    running.set_exception_handler(lambda lp, context: keeper.accept_failed(lp, context, previous))
    config = uvicorn.Config(
        HostGuard(app, rule, counters),
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEAD,
        backlog=BACKLOG,
        server_header=False,
        # limit_concurrency stays unset: uvicorn answers 503 to every request past it, the
        # legitimate one too; the door's own cap closes a half-open connection instead.
        # TLS is the door's own (_TlsDoor): uvicorn's would come before the count.
    )
    # After the config: it sets uvicorn's loggers up when it is made.
    logging.getLogger("uvicorn.error").addFilter(_Quiet(counters))
    return config


class DoorServer(uvicorn.Server):
    """uvicorn's server, stopped by its caller (`stop()`), not by its own signal handlers.

    uvicorn's would replace the loop's and raise the signal again once stopped, so a SIGTERM
    would end the process as killed by it rather than with exit code 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        self.should_exit = True
