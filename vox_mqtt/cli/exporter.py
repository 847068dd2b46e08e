"""`vox exporter`: serve the fleet's metrics to Prometheus (docs/metrics.md).

It logs in like `vox status` (the identity of the config it is given, on a throw-away
client id, no session left behind), keeps the retained statuses and the war room it may
read, and builds the metric families at each scrape. /metrics is served from the start,
whether or not the broker answers: `vox_exporter_broker_connected` says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Final

from vox_mqtt.console.doors import (
    DEFAULT_MAX_CONNECTIONS,
    DoorCounters,
    DoorLimits,
    DoorServer,
    HostRule,
    door_config,
    host_rule,
)
from vox_mqtt.console.exposition import CachedExposition, metrics_app
from vox_mqtt.console.health import asgi_of, health, with_health
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import BrokerUnavailable, Refused
from vox_mqtt.transport.session import Session

from ._common import EXIT_USAGE, add_config_option, fail
from .looks import Reader, load_reader

__all__ = ["add_door_options", "door_settings", "parse_listen", "register"]

DEFAULT_LISTEN = "127.0.0.1:9733"
_PREFIX: Final = "vox exporter: "
_DOOR_FAMILY: Final = "vox_exporter_http_connections"
_LIBRARY: Final = "vox_mqtt"  # the logger the session reports its retries on


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `vox exporter`."""
    parser = subparsers.add_parser(
        "exporter", help="serve every agent's liveness and metrics to Prometheus"
    )
    add_config_option(parser)
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {DEFAULT_LISTEN}; port 0 picks a free one)",
    )
    add_door_options(parser)
    parser.set_defaults(func=cmd_exporter)


def add_door_options(parser: argparse.ArgumentParser) -> None:
    """Add --allowed-host and --max-connections (docs/security.md, F27 and F29)."""
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (repeatable; by default only "
        "the listen address, and localhost on loopback)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"HTTP connections held at most (default {DEFAULT_MAX_CONNECTIONS}); past it "
        "the oldest one without a request in flight is closed",
    )


def door_settings(args: argparse.Namespace, host: str) -> tuple[HostRule, DoorLimits]:
    """Return the Host rule and the limits of the door; raise ValueError with a reason."""
    if args.max_connections < 1:
        raise ValueError(f"--max-connections {args.max_connections}: must be at least 1")
    return host_rule(host, args.allowed_host), DoorLimits(max_connections=args.max_connections)


def parse_listen(text: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 in brackets); raise ValueError with a readable reason."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--listen {text!r} is not HOST:PORT (e.g. 127.0.0.1:9733)")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--listen {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {text!r}: port must be 0..65535")
    return host, port


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve /metrics until SIGTERM or SIGINT."""
    try:
        host, port = parse_listen(args.listen)
        rule, limits = door_settings(args, host)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    reader = load_reader(args.config, "exporter")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family)
    except OSError as exc:
        # create_server adds "(while attempting to bind ...)" to strerror: the errno says it.
        errno = None if isinstance(exc, socket.gaierror) else exc.errno
        why = os.strerror(errno) if errno else (exc.strerror or str(exc))
        fail(f"cannot listen on {host}:{port}: {why}")
        return EXIT_USAGE
    with listener:
        return asyncio.run(_serve(reader, host, listener, rule, limits))


async def _serve(
    reader: Reader, host: str, listener: socket.socket, rule: HostRule, limits: DoorLimits
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    observer = FleetObserver(stale_after=reader.stale_after, signing=reader.broker.signing)
    lines = _LinkLog()

    async def connected() -> None:
        lines.connected(reader.broker.address)
        if session.session_present:
            # A fresh client id never has a session: this broker replaced it with the username.
            lines.say(
                f"warning: the broker gave this look the MQTT session of {reader.name}: it "
                "locks client ids to usernames, so a running client of that identity was "
                "disconnected by it — see docs/broker.md"
            )

    # wait=False: the session retries with its own backoff while /metrics is served, so a
    # scrape tells "broker down" (vox_exporter_broker_connected 0) from "exporter down".
    session = Session(
        reader.broker, subscriptions=_wanted(reader), on_connect=connected, wait=False
    )
    exposition = CachedExposition(
        observer,
        names={reader.id: reader.name, reader.top: reader.top_name},
        loop=loop,
        connected=lambda: session.connected,
    )
    counters = DoorCounters()
    app = asgi_of(
        with_health(
            metrics_app(lambda: exposition.body() + counters.exposition(_DOOR_FAMILY)),
            lambda: health(connected=session.connected, agents=observer.view.agents()),
        )
    )
    server = DoorServer(
        door_config(app, rule=rule, limits=limits, counters=counters, say=lines.say)
    )
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    bound = listener.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    lines.say(
        f"serving http://{shown}:{bound}/metrics (and /health) for what {reader.name} "
        f"({reader.kind}) may read"
    )
    try:
        with lines.attached():
            try:
                await session.__aenter__()
            except Refused as exc:  # unreadable TLS files: nothing a retry can fix
                fail(str(exc))
                return EXIT_USAGE
            pump = asyncio.ensure_future(_pump(session, observer))
            watch = asyncio.ensure_future(_first_link(session, lines))
            try:
                await stop.wait()
            finally:
                for task in (pump, watch):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await session.__aexit__(None, None, None)
    finally:
        server.stop()
        await serving
    return 0


def _wanted(reader: Reader) -> list[str]:
    """Return the topics the exporter reads as this identity."""
    if reader.kind == "agent":
        # An agent's ACL grants exactly these (docs/broker.md); a dynsec broker refuses the
        # wildcard, and a session retrying in the background cannot fall back on its own.
        exact = reader.exact_liveness()
        return exact + ([topics.WARROOM_FILTER] if reader.warroom else [])
    return [*topics.LIVENESS_FILTERS] + ([topics.WARROOM_FILTER] if reader.warroom else [])


async def _pump(session: Session, observer: FleetObserver) -> None:
    async for inbound in session.messages():
        observer.take(inbound)


async def _first_link(session: Session, lines: _LinkLog) -> None:
    """Say once why the first connection is not up yet; the session keeps trying."""
    try:
        await session.wait_connected(session.settings.connect_timeout)
    except BrokerUnavailable as exc:
        lines.not_yet(str(exc))


class _LinkLog(logging.Filter):
    """The exporter's log on stderr: its own lines and the session's, each cause said once.

    While the broker is away the session logs every failed try (up to one every
    reconnect_max seconds); the journal needs the cause once, and again only when it
    changes or after the link was up in between.
    """

    def __init__(self) -> None:
        super().__init__()
        self._holding = True  # until the first connection, or the line saying there is none
        self._last = ""
        self._last_level = logging.WARNING
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setLevel(logging.WARNING)
        self._handler.setFormatter(logging.Formatter(f"{_PREFIX}%(message)s"))
        self._handler.addFilter(self)

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """Show the library's warnings and errors through this log while the block runs."""
        logger = logging.getLogger(_LIBRARY)
        logger.addHandler(self._handler)
        try:
            yield
        finally:
            logger.removeHandler(self._handler)

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a record unless it repeats the last cause, or the first link is pending."""
        text = record.getMessage()
        if text == self._last:
            return False
        self._last, self._last_level = text, record.levelno
        return not self._holding

    def say(self, text: str) -> None:
        """Print one line of the exporter's own."""
        print(f"{_PREFIX}{text}", file=sys.stderr, flush=True)

    def connected(self, address: str) -> None:
        """The link is up: say so, and let the next failure be said again."""
        self._holding = False
        self._last = ""
        self.say(f"connected to the broker at {address}")

    def not_yet(self, why: str) -> None:
        """The first connection did not come within the connect timeout: say why, once."""
        self._holding = False
        kind = "error: " if self._last_level >= logging.ERROR else ""
        self.say(f"{kind}{why} (serving vox_exporter_broker_connected 0 meanwhile; retrying)")
