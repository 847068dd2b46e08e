"""`vox send`: a command to the root, its answer, its follow or its id left running.

Through the operator's console (cli/_home.py) or, with `--one-shot`, logged in as the
operator in this process (OperatorConsole). Its parser is in cli/session.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.safetext import shown
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import ErrorCode, VOXMessage, timeout_refused

from ._ask import SAY_AFTER
from ._common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    config_path,
    fail,
    out_console,
    print_json,
)
from ._home import ConsoleUnreachable, one_shot_wanted, operator_lock, reach
from .follow import follow_command, follow_via_console

__all__ = ["cmd_send", "parse_params"]

_ACK_WAIT = 10.0  # seconds --detach waits for the root's acknowledgement
# After the ack, how long --detach still waits for an end that comes at once (a refusal).
_AT_ONCE = 1.0
# What a person can do about a request refused at once, where its error does not say.
_WHAT_TO_DO = {
    "DELIVERY_FAILED": "; the broker's rules do not let this console publish to the root: "
    "render and reload them from the fleet file (`vox broker render`, `vox broker reload`)",
    "UNAUTHORIZED_SOURCE": "; the root takes commands only from its master: is this "
    "console's config the one the fleet file renders for the operator?",
    "TARGET_INACTIVE": "; `vox status` shows which agents are down",
    "SHUTTING_DOWN": "; the root is stopping: send it again once it is back",
    "LEDGER_UNAVAILABLE": "; the root cannot record (its log says why: a full disk?)",
}


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """Turn KEY=VALUE words into params, VALUE as JSON when it parses."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"param {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def cmd_send(args: argparse.Namespace) -> int:
    """Send one command and print its result."""
    try:
        params = parse_params(args.params)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    # --timeout is the request's deadline: every level waits for it, up to 30 days ahead.
    refused = timeout_refused(args.timeout, "--timeout")
    if refused is not None:
        fail(refused)
        return EXIT_USAGE
    path = config_path(args.config)
    if not one_shot_wanted(args.one_shot):
        return asyncio.run(_send_via_console(path, args, params))
    with operator_lock(path):
        return asyncio.run(_send(path, args, params))


class _Reply:
    """A command's answer as the console sent it: what `_show_reply` reads of a VOXMessage."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.message_id = data.get("message_id")
        self.reply_to = data.get("reply_to")
        details = data.get("details")
        self.details: dict[str, Any] = details if isinstance(details, dict) else {}


def _failed_line(args: argparse.Namespace, item: dict[str, Any]) -> int:
    code, error = item.get("code"), item.get("error", "")
    if code is None:  # the console refused the call itself (bad input)
        fail(f"{args.command}: {error}")
        return EXIT_USAGE
    if args.json:
        print_json({"ok": False, "code": code, "error": error})
    else:
        fail(f"{args.command}: {code}: {error}")
    return EXIT_RUNTIME


async def _send_via_console(path: Path, args: argparse.Namespace, params: dict[str, Any]) -> int:
    """`vox send` through the operator's console (docs/operations.md)."""
    try:
        client = await reach(path)
        hello = await client.hello() or {}
    except ConsoleUnreachable as exc:
        fail(str(exc))
        return EXIT_RUNTIME
    root_name, root_id = str(hello.get("root", "")), str(hello.get("root_id", ""))

    def show(reply: Any) -> int:
        return _show_reply(args, _Reply(reply), root_name, root_id)

    mode = "follow" if args.follow else "detach" if args.detach else "wait"
    body = {"command": args.command, "params": params, "timeout": args.timeout, "mode": mode}
    if args.follow:
        return await follow_via_console(client, args, body, show)
    request_id: str | None = None
    waiting: asyncio.TimerHandle | None = None
    try:
        async for item in client.stream("/v1/send", body):
            kind = item.get("kind")
            if kind == "request":
                request_id = str(item.get("request_id"))
                # Past a second without the end, say what this waits for (issue item 4).
                what = "acknowledgement" if args.detach else "answer"
                line = (
                    f"waiting for the root's {what} to {args.command} (request {request_id}, "
                    f"up to {args.timeout:g} s)"
                )
                waiting = asyncio.get_running_loop().call_later(SAY_AFTER, note, line)
            elif kind == "note":
                note(str(item.get("text", "")))
            elif kind == "answer":
                return show(item)
            elif kind == "detached":
                return _detached(args, request_id, item)
            elif kind == "pending":
                fail(
                    f"request {request_id}: the root has not acknowledged it yet; it stays in "
                    "the console's outbox and is sent again while the console runs"
                )
                return EXIT_RUNTIME
            elif kind == "failed" and item.get("at_once"):
                refused = CommandFailed(str(item.get("code")), str(item.get("error", "")))
                return _ended_at_once(args, UUID(str(request_id)), refused)
            elif kind in ("failed", "refused"):
                return _failed_line(args, item)
    except (OSError, ConsoleUnreachable, asyncio.IncompleteReadError) as exc:
        fail(
            f"the operator's console hung up ({exc or type(exc).__name__})"
            + (f": request {request_id} stays with it" if request_id else "")
        )
        return EXIT_RUNTIME
    finally:
        if waiting is not None:
            waiting.cancel()
    fail(
        "the operator's console hung up before the answer"
        + (f": request {request_id} stays with it" if request_id else "")
    )
    return EXIT_RUNTIME


def note(line: str) -> None:
    """Print a line of what the verb waits for, or what the console knows, on stderr."""
    print(f"vox: {line}", file=sys.stderr, flush=True)


def _detached(args: argparse.Namespace, request_id: str | None, item: dict[str, Any]) -> int:
    state = item.get("state")
    result = item.get("result")
    if args.json:
        done = {"result": result} if state == "completed" else {}
        print_json({"request_id": request_id, "state": state, **done})
    elif state == "completed":
        text = shown(json.dumps(result, default=str))
        out_console().print(f"request {request_id}: completed already: {text}")
    else:
        out_console().print(f"request {request_id}: acknowledged by the root, running")
    return 0


async def _send(path: Path, args: argparse.Namespace, params: dict[str, Any]) -> int:
    async with OperatorConsole(path) as console:
        root_name = console.file.operator.root_name
        root_id = str(console.root_id)

        def show(reply: VOXMessage) -> int:
            return _show_reply(args, reply, root_name, root_id)

        if args.follow:
            return await follow_command(console, args, params, show)
        if args.detach:
            return await _detach(console, args, params)
        try:
            reply = await console.send_command(args.command, params, wait=args.timeout)
        except CommandFailed as exc:
            if args.json:
                print_json({"ok": False, "code": exc.code, "error": exc.error})
            else:
                fail(f"{args.command}: {exc.code}: {exc.error}")
            # Params that do not fit the command are the operator's to fix: bad input.
            return EXIT_USAGE if exc.code == ErrorCode.INVALID_PARAMS else EXIT_RUNTIME
    return show(reply)


async def _detach(
    console: OperatorConsole, args: argparse.Namespace, params: dict[str, Any]
) -> int:
    """Send the command, wait until the root acknowledged it, print its id and leave.

    A refusal or failure that comes at once (a command_error instead of the ack or right
    after it, the broker refusing the publish) is reported with its code and exits 1.
    """
    sent = await console.start_command(args.command, params, wait=args.timeout)
    tracked = sent.tracked
    try:
        async with asyncio.timeout(min(args.timeout, _ACK_WAIT)):
            await _first(tracked.acknowledged, tracked.done)
    except TimeoutError:
        # Still in the outbox: the next `vox` run of this console re-sends it.
        fail(
            f"request {sent.request_id}: the root has not acknowledged it yet; it stays in this "
            "console's outbox and is sent again by its next run"
        )
        return EXIT_RUNTIME
    # The root acknowledges a command it cannot route, then answers NO_ROUTE from its next
    # commit: an end that follows the ack this closely is the report, not "running".
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tracked.done.wait(), _AT_ONCE)
    result: Any = None
    if tracked.done.is_set():  # answered already: its end is the report
        try:
            reply = await sent.answer()  # at once: the request is over
        except CommandFailed as exc:
            return _ended_at_once(args, sent.request_id, exc)
        state, result = "completed", reply.details.get("result")
    else:
        state = "acknowledged"
    if args.json:
        done = {"result": result} if state == "completed" else {}
        print_json({"request_id": str(sent.request_id), "state": state, **done})
    elif state == "completed":
        text = shown(json.dumps(result, default=str))
        out_console().print(f"request {sent.request_id}: completed already: {text}")
    else:
        out_console().print(f"request {sent.request_id}: acknowledged by the root, running")
    return 0


async def _first(*events: asyncio.Event) -> None:
    """Return once any of the events is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _ended_at_once(args: argparse.Namespace, request_id: UUID, exc: CommandFailed) -> int:
    """Report a request refused or failed before it could run: nothing is left running."""
    if args.json:
        print_json(
            {
                "ok": False,
                "request_id": str(request_id),
                "state": "failed",
                "code": exc.code,
                "error": exc.error,
            }
        )
    else:
        # NO_ROUTE's error lists what the root serves; the others get what to look at.
        hint = _WHAT_TO_DO.get(exc.code, "")
        fail(f"{args.command}: {exc.code}: {exc.error}{hint} (request {request_id}: not running)")
    return EXIT_RUNTIME


def _show_reply(
    args: argparse.Namespace, reply: VOXMessage | _Reply, root_name: str, root_id: str
) -> int:
    """Print a command's answer (one JSON object with --json) and return exit code 0."""
    details = reply.details
    # A master answers for its children's work, so the operator's answer comes from the root.
    handler = details.get("handled_by")
    handler_name = root_name if handler == root_id else None
    if args.json:
        data = {
            "ok": True,
            "message_id": str(reply.message_id),
            "reply_to": str(reply.reply_to),
            **details,
            "handled_by_name": handler_name,
        }
        # --follow prints one object per line; the answer is the last of them.
        print(json.dumps(data, default=str)) if args.follow else print_json(data)
        return 0
    out = out_console()
    out.print(f"[bold]{shown(args.command)}[/]: {shown(json.dumps(details.get('result')))}")
    if details.get("summary"):
        out.print(shown(details["summary"]))
    who = handler_name or handler or "?"
    out.print(
        f"[dim]handled by {shown(who)} ({shown(_short(handler))}); "
        f"reply {reply.message_id} to {reply.reply_to}[/]"
    )
    return 0


def _short(value: Any) -> str:
    return str(value)[:8] if value else "-"
