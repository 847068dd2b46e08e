"""`vox exporter`: serve the fleet's metrics to Prometheus (docs/metrics.md).

It logs in like `vox status` (the identity of the config it is given, on a throw-away
client id, no session left behind), keeps the retained statuses and the war room it may
read, and builds the metric families at each scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from prometheus_client import CollectorRegistry, start_http_server

from ..exporter import FleetCollector
from ..transport import Session
from ._common import EXIT_USAGE, add_config_option, fail
from .ops import Reader, load_reader, observing

__all__ = ["parse_listen", "register"]

DEFAULT_LISTEN = "127.0.0.1:9733"


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
    parser.set_defaults(func=cmd_exporter)


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
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    reader = load_reader(args.config, "exporter")
    return asyncio.run(_serve(reader, host, port))


async def _serve(reader: Reader, host: str, port: int) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    sessions: list[Session] = []
    async with observing(reader, warroom=reader.warroom, on_session=sessions.append) as observer:
        collector = FleetCollector(
            observer,
            names={reader.id: reader.name, reader.top: reader.top_name},
            loop=loop,
            connected=lambda: bool(sessions) and sessions[0].connected,
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
            return EXIT_USAGE
        bound = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        print(
            f"vox exporter: serving http://{shown}:{bound}/metrics "
            f"for what {reader.name} ({reader.kind}) may read",
            file=sys.stderr,
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            # shutdown() waits for the serving thread, which may be waiting on this loop.
            await asyncio.to_thread(server.shutdown)
            server.server_close()
            with contextlib.suppress(RuntimeError):
                thread.join(timeout=5)
    return 0
