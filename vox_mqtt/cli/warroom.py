"""`vox warroom`: the open incidents this identity may read, and the posts that follow.

Its rows are also what the operator's console answers for it (cli/console.py). Through a
running console it loads no MQTT, observer or pydantic module: those load with a look of
its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

from vox_mqtt.console.safetext import shown

from ._ask import ask_console, waiting_note
from ._common import wide_console

if TYPE_CHECKING:
    from vox_mqtt.observe.observer import FleetObserver
    from vox_mqtt.observe.warroom import Incident


def incident_row(
    incident: Incident,
    names: Callable[[UUID], str],
    master_of: Callable[[UUID], UUID | None] = lambda _: None,
) -> dict[str, Any]:
    """Return a war-room post as JSON-ready data, with the names the statuses told.

    `rule_broken` says why a post breaks the war-room rule (an agent posts only about
    itself and its own children), judged by the masters the statuses told; else None.
    """
    from vox_mqtt.observe.warroomguard import rule_problem

    row = incident.as_dict()
    row["source_name"] = names(incident.topic.source)
    row["subject_name"] = names(incident.topic.subject)
    row["rule_broken"] = rule_problem(incident.topic.source, incident.topic.subject, master_of)
    return row


def cmd_warroom(args: argparse.Namespace) -> int:
    """List open incidents, then follow new posts if asked.

    With the operator's config and a console running, both come from its live view: the
    posts to follow are numbered there, asked for after the last one printed.
    """
    late = waiting_note("the war room in the console's live view (a console just started)")
    start = None
    if args.follow:  # where the posts to follow start: before the open ones are listed
        start = ask_console(args.config, "/v1/warroom", {"since": -1})
    if not args.follow or start is not None:
        found = ask_console(args.config, "/v1/warroom", {"wait": args.wait}, late=late)
        if found is not None:
            rows = [row for row in found.get("rows", []) if isinstance(row, dict)]
            _print_incidents(rows, as_json=args.json, title="open incidents")
            if start is None:
                return 0
            listed = {str(row.get("message_id")) for row in rows}
            return _follow_console(args, int(start.get("last", 0)), listed)
    import asyncio

    from .looks import load_reader, observing  # a look of its own: MQTT, the observer

    reader = load_reader(args.config)

    async def run() -> int:
        async with observing(reader, warroom=True) as look:
            await look.settled(args.wait, partial="incident")
            observer = look.observer
            names, master_of = _namers(observer)
            rows = open_incident_rows(observer)
            _print_incidents(rows, as_json=args.json, title="open incidents")
            if not args.follow:
                return 0
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            observer.on_incident = lambda incident: queue.put_nowait(
                incident_row(incident, names, master_of)
            )
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while deadline is None or time.monotonic() < deadline:
                try:
                    async with asyncio.timeout(0.5):
                        row = await queue.get()
                except TimeoutError:
                    continue
                _print_incidents([row], as_json=args.json, title=None)
        return 0

    return asyncio.run(run())


def _follow_console(args: argparse.Namespace, last: int, listed: set[str]) -> int:
    """Print the console's war-room posts after `last` as they come, until --duration.

    `listed`: the posts the listing of open incidents showed already; it was asked after
    `last` was, so a post that came in between is in both, and is printed once.
    """
    from ._ask import ask_running
    from ._common import EXIT_RUNTIME, config_path

    config = config_path(args.config)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.5)
        found = ask_running(config, "/v1/warroom", {"since": last})
        if found is None or found[0] != 200:
            print("vox warroom: the operator's console stopped answering", file=sys.stderr)
            return EXIT_RUNTIME
        answer = found[1]
        last = int(answer.get("last", last))
        if answer.get("missed"):
            print(f"vox warroom: {answer['missed']} post(s) came too fast to keep", flush=True)
        rows = [
            row
            for row in answer.get("rows", [])
            if isinstance(row, dict) and str(row.get("message_id")) not in listed
        ]
        listed.clear()  # only the first posts can be in the listing too
        if rows:
            _print_incidents(rows, as_json=args.json, title=None)
    return 0


def _print_incidents(rows: list[dict[str, Any]], *, as_json: bool, title: str | None) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row), flush=True)
        return
    console = wide_console()
    if title is not None:
        console.print(f"[bold]{title}[/]: {len(rows)}")
    for row in rows:
        mark = "[green]RESOLVED[/]" if row["resolved"] else f"[red]{shown(row['severity'])}[/]"
        source = row["source_name"] or row["source"]
        subject = row["subject_name"] or row["subject"]
        broken = "[bold red]RULE BROKEN[/] " if row.get("rule_broken") else ""
        console.print(
            f"{shown(row['emitted_at'])} {broken}{mark} {shown(row['error_code'], 200)} from "
            f"{shown(source)} about {shown(subject)}: {shown(row['description'])}"
        )
    sys.stdout.flush()


def _namers(
    observer: FleetObserver,
) -> tuple[Callable[[UUID], str], Callable[[UUID], UUID | None]]:
    """Return how to name an agent and find its master, as the statuses tell."""

    def names(agent_id: UUID) -> str:
        entry = observer.view.get(agent_id)
        return entry.name if entry is not None and entry.name else ""

    def master_of(agent_id: UUID) -> UUID | None:
        entry = observer.view.get(agent_id)
        return None if entry is None else entry.master_id

    return names, master_of


def open_incident_rows(observer: FleetObserver) -> list[dict[str, Any]]:
    """Return the open incidents as rows, oldest first, named as the statuses tell."""
    names, master_of = _namers(observer)
    rows = [incident_row(i, names, master_of) for i in observer.incidents.values()]
    rows.sort(key=lambda r: str(r["emitted_at"]))
    return rows
