"""A request's life from the operator's seat: `vox request show ID` and `vox cancel ID`.

Both ask the root through the operator's own session (OperatorConsole): the root answers
for its part and asks its child only about the request it delegated, so the report nests
one level per line and names no agent below the root (docs/operations.md, "Find and
cancel a stuck command").
"""

from __future__ import annotations

import argparse
import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from vox_mqtt.console.safetext import shown
from vox_mqtt.protocol.canceling import answered_after_cancel, cancel_verdict

from ._common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    add_config_option,
    add_one_shot_option,
    config_path,
    duration,
    fail,
    out_console,
    print_json,
)
from ._ids import normalize_prefix, pick_by_prefix

if TYPE_CHECKING:
    from vox_mqtt.console.operator import OperatorConsole

__all__ = [
    "EXIT_CANCELING",
    "EXIT_FINISHED",
    "level_lines",
    "parse_request_id",
    "register",
    "resolve_request_id",
]

# `vox cancel`: 0 canceled, 1 it ended otherwise (already finished, or finished below
# before its cancel came), 2 unknown to the root (or bad input), 3 still canceling: a level
# has not confirmed within --wait (docs/operations.md, "Find and cancel a stuck command").
EXIT_FINISHED = EXIT_RUNTIME
EXIT_CANCELING = 3
_CANCEL_EXIT = {"canceled": 0, "canceling": EXIT_CANCELING, "unknown": EXIT_USAGE}
_WAIT = 10.0  # seconds the root (and each level below it) has to answer


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `request show` and `cancel`."""
    request = subparsers.add_parser("request", help="where a request you sent stands")
    verbs = request.add_subparsers(dest="request_verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="ask the root where a request stands, level by level")
    add_config_option(show, agent_too=False)
    show.add_argument("request_id", metavar="ID", help="the request's id, or its first 4+ digits")
    show.add_argument("--json", action="store_true", help="the nested report as JSON")
    show.add_argument("--wait", type=float, default=_WAIT, help=f"seconds (default {_WAIT:g})")
    add_one_shot_option(show)
    show.set_defaults(func=cmd_request_show)

    cancel = subparsers.add_parser("cancel", help="cancel a request you sent, down the tree")
    add_config_option(cancel, agent_too=False)
    cancel.add_argument("request_id", metavar="ID", help="the request's id, or its first 4+ digits")
    cancel.add_argument("--reason", default=None, help="why (at most 200 characters)")
    cancel.add_argument("--json", action="store_true", help="what the cancel has done, as JSON")
    cancel.add_argument(
        "--wait",
        type=float,
        default=_WAIT,
        help=f"seconds for every level to confirm (default {_WAIT:g})",
    )
    add_one_shot_option(cancel)
    cancel.set_defaults(func=cmd_cancel)


def parse_request_id(text: str) -> str:
    """Return a request id as typed, canonical: a whole UUID or the start of one (4+ digits).

    ValueError with the line to show when it is neither.
    """
    return normalize_prefix(text, "request id")


def resolve_request_id(ledger: Path, prefix: str) -> UUID:
    """Return the request this console sent whose id starts with prefix; ValueError if none.

    A whole id is taken as given (the root may know it even if this ledger does not).
    """
    if len(prefix) == 36:
        return UUID(prefix)
    import sqlite3

    from vox_mqtt.ledger.actions import LedgerAction

    if not ledger.is_file():
        raise ValueError(f"no request id starting with {prefix!r}: this console sent none yet")
    # The prefix is hex digits and hyphens only (normalize_prefix): LIKE sees no wildcard.
    uri = f"{ledger.absolute().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            db.execute("PRAGMA busy_timeout = 5000")
            rows = db.execute(
                f"SELECT DISTINCT message_id FROM logs WHERE action = '{LedgerAction.SENT}' AND "
                "message_type = 'command_request' AND message_id LIKE ? LIMIT 6",
                (f"{prefix}%",),
            ).fetchall()
    except sqlite3.Error as exc:
        raise ValueError(f"cannot read {ledger}: {exc}") from None
    where = "the requests this console sent"
    return UUID(pick_by_prefix(prefix, (row[0] for row in rows), "request id", where))


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


def _request_id(args: argparse.Namespace, console: OperatorConsole) -> UUID | None:
    """Return the request id the person gave, a prefix resolved; None after saying why not."""
    try:
        prefix = parse_request_id(args.request_id)
        return resolve_request_id(console.inbox_path.with_name("logs.db"), prefix)
    except ValueError as exc:
        fail(str(exc))
        return None


Asked = tuple[UUID, dict[str, Any], str, dict[str, Any]]


def _ask(args: argparse.Namespace, what: str) -> Asked | int:
    """Ask the root about a request (what: show or cancel): its id, the report, the root's name
    and the doors it came through (console/doorlog.py: `door`, `doors`).

    Through the operator's console unless one-shot (docs/operations.md); an exit code after
    saying why not.
    """
    from ._ask import one_shot_wanted

    path = config_path(args.config)
    if one_shot_wanted(args.one_shot):
        return _ask_one_shot(path, args, what)
    try:
        prefix = parse_request_id(args.request_id)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    body = {"request_id": prefix, "wait": args.wait}
    if what == "cancel":
        body["reason"] = args.reason
    where = "/v1/cancel" if what == "cancel" else "/v1/request"
    asked = _via_console(path, where, body, f"the root's answer about request {prefix}")
    if isinstance(asked, str):
        fail(asked)
        return EXIT_RUNTIME
    status, found, root_name = asked
    if status == 400:
        fail(str(found.get("error")))
        return EXIT_USAGE
    if status != 200 or not isinstance(found.get("report"), dict):
        code = found.get("code")
        fail((f"{code}: " if code else "") + str(found.get("error", f"status {status}")))
        return EXIT_RUNTIME
    doors: dict[str, Any] = {k: found[k] for k in ("door", "doors") if k in found}
    return UUID(str(found["request_id"])), found["report"], root_name, doors


def door_line(doors: dict[str, Any]) -> str | None:
    """Return `vox request show`'s line of the doors a request's acts came through, or None.

    `came through a2a (command), cli (cancel)`; None when the ledger names no door (a
    request sent before doors were recorded).
    """
    acts = [a for a in doors.get("doors") or () if isinstance(a, dict)]
    if not acts:
        return None
    return "came through " + ", ".join(f"{a.get('door')} ({a.get('what')})" for a in acts)


def _via_console(
    path: Path, where: str, body: dict[str, Any], what: str
) -> tuple[int, dict[str, Any], str] | str:
    """Ask the console (started if none runs): status, answer, the root's name; or why not.

    A console that runs is asked with the stdlib client (cli/_ask.py); past a second
    without its answer the verb says what it waits for.
    """
    from ._ask import ask_running, waiting_note

    hello = ask_running(path, "/v1/hello", None)
    if hello is not None and hello[0] == 200:
        found = ask_running(path, where, body, late=waiting_note(what))
        if found is not None:
            return found[0], found[1], str(hello[1].get("root", "the root"))
    import asyncio

    from ._home import ConsoleUnreachable, reach

    async def via_console() -> tuple[int, dict[str, Any], str]:
        client = await reach(path)
        hello = await client.hello() or {}
        status, found = await client.call("POST", where, body)
        return status, found, str(hello.get("root", "the root"))

    try:
        return asyncio.run(via_console())
    except (ConsoleUnreachable, OSError, asyncio.IncompleteReadError) as exc:
        return str(exc) or "the operator's console hung up"


def _ask_one_shot(path: Path, args: argparse.Namespace, what: str) -> Asked | int:
    """Log in as the operator in this process and ask the root (`--one-shot`)."""
    import asyncio

    from vox_mqtt.console.doorlog import request_doors
    from vox_mqtt.console.operator import OperatorConsole

    from ._home import operator_lock

    console = OperatorConsole(path)
    request_id = _request_id(args, console)
    if request_id is None:
        return EXIT_USAGE

    async def run(request_id: UUID) -> tuple[dict[str, Any], dict[str, Any]]:
        async with console:
            if what == "cancel":
                found = await console.cancel(request_id, reason=args.reason, wait=args.wait)
                return found, {}
            found = await console.request_status(request_id, wait=args.wait)
            return found, await request_doors(console.agent.ledger, request_id)

    with operator_lock(path):
        report, doors = asyncio.run(run(request_id))
    return request_id, report, console.file.operator.root_name, doors


def cmd_request_show(args: argparse.Namespace) -> int:
    """Print where a request stands at each level; exit 2 if the root does not know it."""
    asked = _ask(args, "show")
    if isinstance(asked, int):
        return asked
    request_id, report, root_name, doors = asked
    if report.get("state") == "unknown":
        fail(f"request {request_id}: unknown to the root ({root_name})")
        return EXIT_USAGE
    # A canceled request: what the cancel has done, which level has not confirmed (if one);
    # also one that ended after its cancel, with the answer that came up from below anyway.
    canceled = report.get("state") in ("canceled", "canceling") or answered_after_cancel(report)
    verdict = cancel_verdict(report, root_name) if canceled else None
    if args.json:
        extra = {} if verdict is None else {"cancel": verdict.as_json()}
        print_json({**report, **doors, **extra})
        return 0
    out = out_console()
    out.print(f"[bold]request {request_id}[/]")
    through = door_line(doors)
    if through is not None:
        out.print(shown(through, 400))
    if verdict is not None:
        out.print(shown(verdict.line, 400))
    for line in level_lines(report, root_name, datetime.now(UTC)):
        out.print(shown(line, 400))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a request: exit 0 canceled, 1 not canceled (it ended), 2 unknown, 3 canceling."""
    from vox_mqtt.protocol.lifecycle import MAX_TEXT

    if args.reason is not None and len(args.reason) > MAX_TEXT:
        fail(f"--reason is {len(args.reason)} characters long: at most {MAX_TEXT}")
        return EXIT_USAGE
    asked = _ask(args, "cancel")
    if isinstance(asked, int):
        return asked
    request_id, report, root_name, _ = asked
    state = str(report.get("state", "unknown"))
    code = _CANCEL_EXIT.get(state, EXIT_FINISHED)
    if args.json:
        print_json(report)
        return code
    if state == "unknown":
        fail(f"request {request_id}: unknown to the root ({root_name}), nothing canceled")
        return code
    # One line, what the cancel has done (protocol/canceling.py): `canceling` names the
    # level that has not confirmed; never `canceled` while a level may still run it.
    line = report.get("line") or state
    out_console().print(f"request {request_id}: {shown(str(line), 400)}")
    return code
