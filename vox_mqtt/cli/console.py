"""`vox console serve|stop|status`: the operator's resident console (docs/operations.md).

`serve` is the one process that logs in as the operator; the other verbs reach it over its
socket (cli/_home.py). `stop` asks it to stop, `status` says whether one runs and where.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ._common import EXIT_RUNTIME, EXIT_USAGE, add_config_option, config_path, fail, print_json

if TYPE_CHECKING:
    from vox_mqtt.console.operator import OperatorConsole
    from vox_mqtt.console.web_state import WebState

    from .looks import Reader

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
    serve.add_argument(
        "--a2a",
        metavar="HOST:PORT",
        default=None,
        help="also serve the fleet's root as an A2A agent here (docs/a2a.md); any address but "
        "loopback needs --a2a-token-file",
    )
    serve.add_argument(
        "--a2a-token-file", type=Path, metavar="FILE", help="the bearer token A2A clients present"
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
    from vox_mqtt.console.home.api import HomeParts
    from vox_mqtt.console.home.server import ServeOptions, ServeParts, serve

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
    try:
        a2a, a2a_token = _a2a(args, parse_listen)
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
    path = config_path(args.config)

    def load() -> ServeParts:
        from .looks import load_reader
        from .web import _follow, _operator_pages, _sender

        reader = load_reader(path, "watch")
        return ServeParts(
            reader=reader,
            pages=_operator_pages(reader, path),
            follow_pages=_follow,
            sender_of=_sender,
            home=HomeParts(
                resolve_request=_resolve_request,
                inbox=_inbox,
                status=partial(_status, reader),
                warroom=_incidents,
                watch=partial(_watch, reader),
                posts=_posts,
            ),
        )

    options = ServeOptions(
        config=path,
        socket=args.socket,
        web=web,
        web_token=token,
        tls=tls,
        idle=args.idle,
        a2a=a2a,
        a2a_token=a2a_token,
    )
    try:
        return asyncio.run(serve(options, load))
    except OSError as exc:
        fail(f"the console could not start: {exc.strerror or exc}")
        return EXIT_RUNTIME


def _a2a(args: argparse.Namespace, parse: Any) -> tuple[tuple[str, int] | None, str | None]:
    """`--a2a` and its token; ValueError (one line) for a bad one or a bare non-loopback bind."""
    from vox_mqtt.console.web_state import is_loopback

    if args.a2a is None:
        return None, None
    listen: tuple[str, int] = parse(args.a2a)
    token = None
    if args.a2a_token_file is not None:
        try:
            token = args.a2a_token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"--a2a-token-file: {exc.strerror or exc}") from None
        if len(token) < 16:
            raise ValueError("the A2A token must be at least 16 characters")
    if token is None and not is_loopback(listen[0]):
        # docs/a2a.md, "Security": beyond loopback every caller presents the bearer token.
        raise ValueError(f"refusing to serve A2A on {listen[0]} without --a2a-token-file")
    return listen, token


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the console to stop; exit 0 whether one ran or not (it is stopped either way)."""
    from vox_mqtt.console.home.place import OperatorLock

    from ._home import ConsoleUnreachable, reach, state_dir_of

    async def run() -> int:
        try:
            client = await reach(config_path(args.config), start=False)
        except ConsoleUnreachable:
            print("vox console: none runs")
            return 0
        _status, found = await client.call("POST", "/v1/stop")
        pid = found.get("pid", "?")
        # It is stopped once its lock is free, as systemctl waits for the process: its socket
        # goes first, its MQTT session after, and only then does it let the lock go. Whoever
        # logs in as the operator next would otherwise take over a session still closing.
        lock = OperatorLock(state_dir_of(config_path(args.config)))
        for _ in range(200):
            if await client.hello() is None and not lock.held():
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


# --- what the console lends from the verbs (console/home/api.py, HomeParts) ----------------


def _resolve_request(ledger: Path, text: str) -> UUID:
    from .lifecycle import parse_request_id, resolve_request_id

    return resolve_request_id(ledger, parse_request_id(text))


def _inbox(console: OperatorConsole) -> list[dict[str, Any]]:
    from .session import inbox_entries

    return inbox_entries(console)


def _status(reader: Reader, state: WebState, data: dict[str, Any]) -> dict[str, Any]:
    """`vox status` from the console's live view: the table as text, or the JSON document."""
    from rich.console import Console
    from rich.text import Text

    from vox_mqtt.console.safetext import shown

    from .statuslayout import cut
    from .statusview import _link_rows, shown_agents, status_lines, status_row

    observer = state.observer
    observer.view.refresh()
    links = state.links
    agents = shown_agents(observer)
    if links is not None:
        agents = links.overlay(agents)
    incidents = list(observer.incidents.values())
    if data.get("json"):
        now = time.monotonic()
        ordered = sorted(agents, key=lambda a: a.name)
        document: dict[str, Any] = {
            "identity": {"kind": reader.kind, "name": reader.name, "id": reader.id},
            "agents": [status_row(a, incidents, now) for a in ordered],
        }
        if links is not None:
            document["links"] = _link_rows(links)
        return {"document": document}
    # Laid out for the client's terminal (cli/statuslayout.py); None: every column, --wide.
    width = data.get("width")
    width = int(width) if isinstance(width, int) and not isinstance(width, bool) else None
    out = io.StringIO()
    rich = Console(
        file=out,
        width=width or 10_000,
        soft_wrap=True,
        highlight=False,
        emoji=False,
        force_terminal=bool(data.get("color")),
    )
    title = f"vox fleet status, as seen by {shown(reader.name)} ({reader.kind})"
    rich.print(Text(cut(title, width or len(title))), crop=False)
    for line in status_lines(agents, incidents, width):
        rich.print(line, crop=False)
    return {"text": out.getvalue()}


def _watch(reader: Reader, state: WebState, data: dict[str, Any]) -> dict[str, Any]:
    """One frame of `vox watch` from the console's live view (cli/watchview.py).

    Unknown since the link went down or silent (web_state's link_state): the same truth
    the web console shows.
    """
    from datetime import datetime

    from .watchview import watch_frame, watch_text

    known, since = state.link_state()
    down_since = None
    if not known:
        at = datetime.now() if since is None else datetime.fromtimestamp(since)
        down_since = at.strftime("%H:%M:%S")
    else:
        state.observer.view.refresh()
    links = state.links
    if not data.get("plain"):
        width = data.get("width")
        width = int(width) if isinstance(width, int) and not isinstance(width, bool) else None
        text = watch_text(reader, state.observer, links, width, bool(data.get("color")), down_since)
        return {"text": text}
    lines = data.get("lines")
    return watch_frame(reader, state.observer, links, down_since, lines)


def _posts(state: WebState, since: int) -> dict[str, Any]:
    """`vox warroom --follow`'s posts after `since`, named as the statuses tell."""
    from .warroom import _namers, incident_row

    last, missed, posts = state.posts_since(since)
    names, master_of = _namers(state.observer)
    rows = [incident_row(incident, names, master_of) for incident in posts]
    return {"last": last, "missed": missed, "rows": rows}


def _incidents(state: WebState) -> list[dict[str, Any]]:
    """`vox warroom`'s rows from the console's live view."""
    from .warroom import open_incident_rows

    return open_incident_rows(state.observer)
