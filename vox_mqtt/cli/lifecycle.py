"""A request's life from the operator's seat: `vox request show ID` and `vox cancel ID`.

Both ask the root through the operator's own session (OperatorConsole): the root answers
for its part and asks its child only about the request it delegated, so the report nests
one level per line and names no agent below the root (docs/operations.md, "Find and
cancel a stuck command").
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.safetext import shown

from ._common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    add_config_option,
    config_path,
    duration,
    fail,
    out_console,
    print_json,
)

__all__ = ["EXIT_FINISHED", "level_lines", "parse_request_id", "register"]

# `vox cancel`: 0 canceled, 1 it had already finished, 2 unknown to the root (or bad input).
EXIT_FINISHED = EXIT_RUNTIME
_WAIT = 10.0  # seconds the root (and each level below it) has to answer


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `request show` and `cancel`."""
    request = subparsers.add_parser("request", help="where a request you sent stands")
    verbs = request.add_subparsers(dest="request_verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="ask the root where a request stands, level by level")
    add_config_option(show, agent_too=False)
    show.add_argument("request_id", metavar="ID", help="the request's id (`vox send` prints it)")
    show.add_argument("--json", action="store_true", help="the nested report as JSON")
    show.add_argument("--wait", type=float, default=_WAIT, help=f"seconds (default {_WAIT:g})")
    show.set_defaults(func=cmd_request_show)

    cancel = subparsers.add_parser("cancel", help="cancel a request you sent, down the tree")
    add_config_option(cancel, agent_too=False)
    cancel.add_argument("request_id", metavar="ID", help="the request's id (`vox send` prints it)")
    cancel.add_argument("--reason", default=None, help="why (at most 200 characters)")
    cancel.add_argument("--json", action="store_true", help="the root's cancel report as JSON")
    cancel.add_argument("--wait", type=float, default=_WAIT, help=f"seconds (default {_WAIT:g})")
    cancel.set_defaults(func=cmd_cancel)


def parse_request_id(text: str) -> UUID:
    """Return the request id a person typed; ValueError with the line to show if it is none."""
    try:
        return UUID(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not a request id: a UUID such as the one `vox send` printed"
        ) from None


def _ago(since: Any, now: datetime) -> str:
    try:
        at = datetime.fromisoformat(str(since))
    except ValueError:
        return ""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return f" ({duration(max(0.0, (now - at).total_seconds()))} ago)"


def level_lines(report: dict[str, Any], root_name: str, now: datetime) -> list[str]:
    """Return one line per level of a nested status report, the root's first.

    Only the root has a name the operator knows; the levels below are numbered, as the
    report names no agent below the root (docs/messages.md).
    """
    lines = []
    part: Any = report
    depth = 0
    while isinstance(part, dict) and depth < 64:
        who = root_name if depth == 0 else f"level {depth + 1}"
        state = str(part.get("state", "?"))
        since = part.get("since")
        line = f"{'  ' * depth}{'└ ' if depth else ''}{who}: {state}"
        if since:
            line += f" since {since}{_ago(since, now)}"
        if part.get("why"):
            line += f" — {part['why']}"
        lines.append(line)
        part = part.get("below")
        depth += 1
    return lines


def _request_id(args: argparse.Namespace) -> UUID | None:
    try:
        return parse_request_id(args.request_id)
    except ValueError as exc:
        fail(str(exc))
        return None


def cmd_request_show(args: argparse.Namespace) -> int:
    """Print where a request stands at each level; exit 2 if the root does not know it."""
    request_id = _request_id(args)
    if request_id is None:
        return EXIT_USAGE
    path = config_path(args.config)

    async def run(path: Path) -> tuple[dict[str, Any], str]:
        async with OperatorConsole(path) as console:
            report = await console.request_status(request_id, wait=args.wait)
            return report, console.file.operator.root_name

    report, root_name = asyncio.run(run(path))
    if report.get("state") == "unknown":
        fail(f"request {request_id}: unknown to the root ({root_name})")
        return EXIT_USAGE
    if args.json:
        print_json(report)
        return 0
    out = out_console()
    out.print(f"[bold]request {request_id}[/]")
    for line in level_lines(report, root_name, datetime.now(UTC)):
        out.print(shown(line, 400))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a request; exit 0 canceled, 1 already finished, 2 unknown to the root."""
    request_id = _request_id(args)
    if request_id is None:
        return EXIT_USAGE
    if args.reason is not None and len(args.reason) > 200:
        fail(f"--reason is {len(args.reason)} characters long: at most 200")
        return EXIT_USAGE
    path = config_path(args.config)

    async def run(path: Path) -> tuple[dict[str, Any], str]:
        async with OperatorConsole(path) as console:
            report = await console.cancel(request_id, reason=args.reason, wait=args.wait)
            return report, console.file.operator.root_name

    report, root_name = asyncio.run(run(path))
    state = str(report.get("state", "unknown"))
    code = 0 if state == "canceled" else EXIT_USAGE if state == "unknown" else EXIT_FINISHED
    if args.json:
        print_json(report)
        return code
    if state == "unknown":
        fail(f"request {request_id}: unknown to the root ({root_name}), nothing canceled")
        return code
    since = report.get("since")
    when = f" since {since}" if since else ""
    if state == "canceled":
        out_console().print(shown(f"request {request_id}: canceled{when}"))
    else:
        out_console().print(
            f"request {request_id}: not canceled, already {shown(state)}{shown(when)}"
        )
    return code
