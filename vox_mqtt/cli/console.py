"""`vox console serve|stop|status`: the operator's resident console (docs/operations.md).

`serve` is the one process that logs in as the operator; the other verbs reach it over its
socket (cli/_home.py). `stop` asks it to stop, `status` says whether one runs and where.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from ._common import EXIT_RUNTIME, EXIT_USAGE, add_config_option, config_path, fail, print_json

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `console serve`, `console stop` and `console status`."""
    console = subparsers.add_parser(
        "console", help="the operator's resident console, which every verb is a client of"
    )
    verbs = console.add_subparsers(dest="console_verb", metavar="VERB", required=True)
    serve = verbs.add_parser(
        "serve", help="be the operator: own its session and serve the verbs (and a browser)"
    )
    add_config_option(serve, agent_too=False)
    serve.add_argument(
        "--web",
        metavar="HOST:PORT",
        default=None,
        help="also serve the web console here (port 0 picks a free one); any address but "
        "loopback needs --token-file or --generate-token",
    )
    token = serve.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, metavar="FILE", help="the web console's token")
    token.add_argument(
        "--generate-token", action="store_true", help="a fresh web token, printed in the URL"
    )
    serve.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve the web door as HTTPS")
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument(
        "--socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="the Unix socket to serve the verbs on (default: console.sock in the operator's "
        "state dir, where the verbs look for it)",
    )
    serve.add_argument(
        "--idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop this long after the last client left (default: run until stopped)",
    )
    serve.set_defaults(func=cmd_serve)

    stop = verbs.add_parser("stop", help="stop the operator's console, if one runs")
    add_config_option(stop, agent_too=False)
    stop.set_defaults(func=cmd_stop)

    status = verbs.add_parser("status", help="say whether the operator's console runs")
    add_config_option(status, agent_too=False)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the console until stopped."""
    from vox_mqtt.console.home.server import ServeOptions, serve

    from .exporter import parse_listen
    from .web import _tls, _token

    web = None
    try:
        if args.web is not None:
            web = parse_listen(args.web)
        token = _token(args)
        tls = _tls(args)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    if args.idle is not None and not args.idle > 0:
        fail(f"--idle must be a positive number of seconds, not {args.idle}")
        return EXIT_USAGE
    if web is not None:
        from vox_mqtt.console.web_state import bind_problem

        problem = bind_problem(web[0], token, tls is not None)
        if problem is not None:
            fail(problem)
            return EXIT_USAGE
    logging.basicConfig(level=logging.WARNING, format="vox console: %(message)s", stream=sys.stderr)
    options = ServeOptions(
        config=config_path(args.config),
        socket=args.socket,
        web=web,
        web_token=token,
        tls=tls,
        idle=args.idle,
    )
    try:
        return asyncio.run(serve(options))
    except OSError as exc:
        fail(f"the console could not start: {exc.strerror or exc}")
        return EXIT_RUNTIME


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the console to stop; exit 0 whether one ran or not (it is stopped either way)."""
    from ._home import ConsoleUnreachable, reach

    async def run() -> int:
        try:
            client = await reach(config_path(args.config), start=False)
        except ConsoleUnreachable:
            print("vox console: none runs")
            return 0
        _status, found = await client.call("POST", "/v1/stop")
        pid = found.get("pid", "?")
        # It is stopped once its socket is gone: wait for that (bounded), as systemctl does.
        for _ in range(200):
            if await client.hello() is None:
                break
            await asyncio.sleep(0.05)
        print(f"vox console: stopped (pid {pid})")
        return 0

    return asyncio.run(run())


def cmd_status(args: argparse.Namespace) -> int:
    """Print whether a console runs (exit 0) or not (exit 1)."""
    from ._home import ConsoleUnreachable, reach

    async def run() -> int:
        try:
            client = await reach(config_path(args.config), start=False)
        except ConsoleUnreachable as exc:
            if args.json:
                print_json({"running": False})
            else:
                print(f"vox console: not running ({exc})")
            return EXIT_RUNTIME
        hello = await client.hello() or {}
        if args.json:
            print_json({"running": True, "socket": str(client.socket_path), **hello})
        else:
            print(
                f"vox console: pid {hello.get('pid')}, operator {hello.get('operator')}, root "
                f"{hello.get('root')}, up {hello.get('up_s')}s, on {client.socket_path}"
            )
        return 0

    return asyncio.run(run())
