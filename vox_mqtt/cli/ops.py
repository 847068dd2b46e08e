"""The read-only looks: `vox status`, `watch` and `warroom`, their parsers and first step.

`status`, `watch` and `warroom` are read-only: they log in as the identity of the config
they are given (the operator's console config, or an agent's daemon config) on a
throw-away client id, and show whatever the broker's ACL lets that identity read. With the
operator's config and a console running, `status` and `warroom` ask the console instead,
and load nothing more than its client (cli/_home.py); the looks themselves are in
cli/statusview.py and cli/warroom.py, loaded when a verb looks for itself.
"""

from __future__ import annotations

import argparse
import sys

from ._ask import ask_console, waiting_note
from ._common import add_config_option, print_json, status_width

__all__ = ["register"]

# A look ends its wait at the end-of-retained marker (Session.caught_up), at once in a small
# fleet; this bound only matters where the broker or this machine is starved.
_WAIT = 30.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator verbs."""

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help)
        add_config_option(parser)
        return parser

    status = verb("status", "show the liveness of every agent one may see")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--wide", action="store_true", help="every column, however wide the terminal"
    )
    _add_wait(status, "statuses")
    status.set_defaults(func=cmd_status)

    watch = verb("watch", "live tree of the fleet coloured by health")
    watch.add_argument("--duration", type=float, default=None, help="stop after N seconds")
    watch.set_defaults(func=cmd_watch)

    warroom = verb("warroom", "list the open war-room incidents")
    warroom.add_argument("--follow", action="store_true", help="then print new posts as they come")
    warroom.add_argument("--duration", type=float, default=None, help="stop following after N s")
    warroom.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_wait(warroom, "incidents")
    warroom.set_defaults(func=_warroom)


def _add_wait(parser: argparse.ArgumentParser, what: str) -> None:
    help = f"at most this many seconds for the retained {what} (default {_WAIT:g})"
    parser.add_argument("--wait", type=float, default=_WAIT, help=help)


def cmd_status(args: argparse.Namespace) -> int:
    """Print the liveness of every agent whose status this identity may read."""
    body = {
        "wait": args.wait,
        "json": args.json,
        "width": status_width(args.wide),  # None: every column (--wide)
        "color": sys.stdout.isatty(),
    }
    late = waiting_note("the statuses in the console's live view (a console just started)")
    found = ask_console(args.config, "/v1/status", body, late=late)
    if found is not None:
        if args.json:
            print_json(found.get("document"))
        else:
            sys.stdout.write(str(found.get("text", "")))
        return 0
    from .statusview import status_look  # a look of its own: MQTT, the observer, rich

    return status_look(args)


def cmd_watch(args: argparse.Namespace) -> int:
    """Show a live tree of the fleet until interrupted or --duration has passed."""
    from .watchview import cmd_watch as watch  # the console's frames, or a look's own

    return watch(args)


def _warroom(args: argparse.Namespace) -> int:
    from .warroom import cmd_warroom  # the war room's verb, loaded when it runs

    return cmd_warroom(args)
