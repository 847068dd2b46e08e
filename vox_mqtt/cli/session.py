"""The operator's own session: `vox send` a command to the root, `vox inbox` its notes to you.

Both verbs' parsers, and the inbox. `vox inbox` asks a running console with the stdlib
client (cli/_ask.py) and loads no MQTT or pydantic module then; `vox send` is in
cli/send.py, loaded when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from vox_mqtt.console.safetext import shown

from ._common import (
    EXIT_RUNTIME,
    add_config_option,
    add_one_shot_option,
    config_path,
    fail,
    out_console,
    print_json,
)

if TYPE_CHECKING:
    from vox_mqtt.console.operator import OperatorConsole

__all__ = ["inbox_entries", "register"]

# The key of a job notification that lists the undecided jobs it overlaps
# (console/decisions.py, OVERLAPS; tests/unit/test_cli_verbs.py holds them equal).
_OVERLAPS = "overlaps_undecided"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `send` and `inbox`."""
    send = subparsers.add_parser("send", help="send a command to the root and print the answer")
    add_config_option(send, agent_too=False)
    send.add_argument("command")
    send.add_argument(
        "params",
        nargs="*",
        metavar="KEY=VALUE",
        help="command params; VALUE is read as JSON when it parses, else a string",
    )
    send.add_argument("--timeout", type=float, default=30.0)
    send.add_argument("--json", action="store_true")
    send.add_argument(
        "--follow",
        action="store_true",
        help="print each transition (sent, acknowledged, working, progress, ...) as it happens",
    )
    send.add_argument(
        "--cancel-on-interrupt",
        action="store_true",
        help="with --follow: Ctrl-C cancels the request without asking",
    )
    send.add_argument(
        "--detach",
        action="store_true",
        help="print the request's id once the root has it and leave it running "
        "(`vox request show ID`, `vox cancel ID`)",
    )
    add_one_shot_option(send)
    send.set_defaults(func=cmd_send)

    inbox = subparsers.add_parser(
        "inbox",
        help="fetch the root's notifications, show them (new ones marked) and mark them read",
    )
    add_config_option(inbox, agent_too=False)
    inbox.add_argument(
        "--wait", type=float, default=2.0, help="seconds to collect queued ones (default 2)"
    )
    inbox.add_argument("--unread", action="store_true", help="show only the unread ones")
    inbox.add_argument(
        "--undecided", action="store_true", help="show only the jobs nobody decided yet"
    )
    inbox.add_argument(
        "--keep-unread", action="store_true", help="do not move the read mark (a peek)"
    )
    inbox.add_argument("--json", action="store_true")
    add_one_shot_option(inbox)
    inbox.set_defaults(func=cmd_inbox)


def cmd_send(args: argparse.Namespace) -> int:
    """Send one command and print its result (cli/send.py)."""
    from .send import cmd_send as send

    return send(args)


# --- the inbox ---------------------------------------------------------------------------------


def cmd_inbox(args: argparse.Namespace) -> int:
    """Collect queued notifications from the root, then print them, new ones marked."""
    from ._ask import one_shot_wanted

    path = config_path(args.config)
    if one_shot_wanted(args.one_shot):
        entries, inbox_path = _inbox_one_shot(path, args.wait)
    else:
        got = _inbox_via_console(path, args.wait)
        if isinstance(got, int):
            return got
        entries, inbox_path = got
    mark = ReadMark(inbox_path.with_name("inbox.read"))
    unread_from = mark.first_unread(entries)
    for index, entry in enumerate(entries):
        entry["read"] = index < unread_from
    listed = entries[unread_from:] if args.unread else entries
    if args.undecided:
        listed = [e for e in listed if "job" in e and e.get("decision") is None]
    if not args.keep_unread and entries and isinstance(entries[-1].get("message_id"), str):
        mark.advance(entries[-1]["message_id"])
    if args.json:
        print_json(listed)
        return 0
    _print_inbox(listed, unread=len(entries) - unread_from)
    return 0


def _inbox_one_shot(path: Path, wait: float) -> tuple[list[dict[str, Any]], Path]:
    """Log in as the operator in this process for `wait` seconds; the entries and the inbox."""
    import asyncio

    from vox_mqtt.console.operator import OperatorConsole

    from ._home import operator_lock

    async def one_shot() -> tuple[list[dict[str, Any]], Path]:
        async with OperatorConsole(path) as console:
            await asyncio.sleep(wait)
            entries = inbox_entries(console)
        return entries, console.inbox_path

    with operator_lock(path):
        return asyncio.run(one_shot())


def _inbox_via_console(path: Path, wait: float) -> tuple[list[dict[str, Any]], Path] | int:
    """Ask the console (started if none runs); the entries and the inbox, or an exit code."""
    from ._ask import ask_running, waiting_note

    late = waiting_note(f"the root's queued notifications (up to {wait:g} s)")
    answer = ask_running(path, "/v1/inbox", {"wait": wait}, late=late)
    if answer is None:  # no console answers: start one (cli/_home.py)
        import asyncio

        from ._home import ConsoleUnreachable, reach

        async def via_console() -> tuple[int, dict[str, Any]]:
            client = await reach(path)
            return await client.call("POST", "/v1/inbox", {"wait": wait})

        try:
            answer = asyncio.run(via_console())
        except (ConsoleUnreachable, OSError, asyncio.IncompleteReadError) as exc:
            fail(str(exc) or "the operator's console hung up")
            return EXIT_RUNTIME
    status, found = answer
    if status != 200:
        fail(f"inbox: {found.get('error', status)}")
        return EXIT_RUNTIME
    return list(found.get("entries") or []), Path(str(found["inbox_path"]))


def inbox_entries(console: OperatorConsole) -> list[dict[str, Any]]:
    """Return the kept notifications, oldest first, sealed notes opened, jobs numbered.

    What `vox inbox` lists, read marks aside; the console serves the same (`/v1/inbox`).
    """
    from .decide import job_json

    entries = [console.opened(entry) for entry in console.notifications()]
    jobs = console.jobs()
    root_name = console.file.operator.root_name
    root_id = str(console.root_id)
    by_id = {job.message_id: job for job in jobs}
    for entry in entries:
        source = entry.get("source", root_id)  # the root is the console's only peer
        entry["source_name"] = root_name if source == root_id else ""
        job = by_id.pop(str(entry.get("message_id")), None)
        if job is not None:  # the first copy of a job notification carries its number
            entry.update(job_json(job, jobs))
    return entries


def _print_inbox(entries: list[dict[str, Any]], *, unread: int) -> None:
    out = out_console()
    out.print(f"[bold]operator inbox[/]: {len(entries)} notification(s), {unread} new")
    undecided = sum(1 for e in entries if "job" in e and e.get("decision") is None)
    if undecided:
        out.print(f"{undecided} job(s) undecided: `vox decide N approve|reject [--note TEXT]`")
    for entry in entries:
        # A kept notification is shown as text whatever it holds (docs/operations.md).
        raw = entry.get("details")
        details = dict(raw) if isinstance(raw, dict) else {"details": raw}
        note = details.pop("note_to_human", None)
        details.pop(_OVERLAPS, None)  # shown as job numbers below
        flag = "  " if entry.get("read") else "[bold yellow]● [/]"
        sender = entry.get("source_name") or entry.get("source") or "?"
        via = entry.get("message_source")
        number = f" [bold]#{entry['job']}[/]" if isinstance(entry.get("job"), int) else ""
        out.print(
            f"{flag}{shown(entry.get('emitted_at', '?'))} [bold]{shown(entry.get('type', '?'))}[/]"
            f"{number} from {shown(sender)}{f' ({shown(via)})' if via else ''}: "
            f"{shown(json.dumps(details, default=str), 20_000)}"
        )
        if number:
            out.print(f"    [cyan]{shown(str(entry.get('summary', '')))}[/]")
        if note:
            for line in str(note).splitlines():
                out.print(f"    {shown(line)}")


class ReadMark:
    """The id of the newest notification the operator has seen, kept next to the inbox."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> str | None:
        """Return the message id of the last read notification, if any."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
            return str(UUID(text))
        except (OSError, ValueError):
            return None

    def first_unread(self, entries: list[dict[str, Any]]) -> int:
        """Return the index of the first notification after the mark (0 when none is read)."""
        last = self.read()
        if last is None:
            return 0
        for index in range(len(entries) - 1, -1, -1):
            if entries[index].get("message_id") == last:
                return index + 1
        return 0  # the mark is gone (the inbox was cleared): everything is new

    def advance(self, message_id: str) -> None:
        """Move the mark to this notification, atomically."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{message_id}\n", encoding="utf-8")
        os.replace(tmp, self.path)
