"""The read-only looks: `vox status`, `watch` and `warroom`.

`status`, `watch` and `warroom` are read-only: they log in as the identity of the config
they are given (the operator's console config, or an agent's daemon config) on a
throw-away client id, and show whatever the broker's ACL lets that identity read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.tree import Tree

from vox_mqtt.console.safetext import shown
from vox_mqtt.observe.metrics import parse_host_metrics, parse_snapshot, quantile
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, INACTIVE, STALE, AgentLiveness
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.observe.warroomguard import rule_problem
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.sitelinks import (
    SITE_LINK_LOST,
    UNREACHABLE,
    LinkWatch,
)

from ._common import add_config_option, config_path, out_console, print_json
from ._downtime import liveliness
from ._inflight import in_flight, in_flight_text
from .looks import Reader, load_reader, observing

__all__ = ["register"]

_COLOURS = {ACTIVE: "green", STALE: "yellow", INACTIVE: "red", UNREACHABLE: "red"}
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
    warroom.set_defaults(func=cmd_warroom)


def _add_wait(parser: argparse.ArgumentParser, what: str) -> None:
    help = f"at most this many seconds for the retained {what} (default {_WAIT:g})"
    parser.add_argument("--wait", type=float, default=_WAIT, help=help)


# --- read-only looks: status, watch, warroom (who looks, and how: looks.py) -----------------


def _wide_console() -> Console:
    # A pipe gets 80 columns by default; a table of UUIDs needs more to stay readable.
    console = out_console()
    if not console.is_terminal:
        console.width = max(console.width, 200)
    return console


def _percent(value: Any, digits: int = 0) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.{digits}f}"


def activity(metrics: dict[str, Any]) -> tuple[str, str, str]:
    """Return messages/s, errors and median command time from a heartbeat's metrics."""
    snapshot = parse_snapshot(metrics.get("agent"))
    if snapshot is None:
        return "-", "-", "-"
    rate = "-" if snapshot.messages_per_s is None else f"{snapshot.messages_per_s:.1f}"
    handler = snapshot.histograms.get("command_handler_seconds")
    median = None if handler is None else quantile(handler, 0.5)
    p50 = "-" if median is None else f"{median * 1000:.1f}ms"
    return rate, str(snapshot.errors()), p50


def _mebibytes(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value / 2**20:.0f} MiB"


def status_table(
    agents: list[AgentLiveness], title: str, incidents: Sequence[Incident] = ()
) -> Table:
    """Return the status table: one row per agent, its own figures next to its host's."""
    table = Table(title=title)
    columns = (
        *("name", "id", "status", "epoch", "liveness", "msg/s", "errors", "p50 cmd"),
        *("cpu%", "rss"),
        *("host cpu%", "host mem%", "disk%", "in flight", "commands"),
    )
    for column in columns:
        # The state and its code stay on one line: a narrow terminal shortens the id instead.
        table.add_column(column, no_wrap=column in ("name", "status", "liveness"))
    now = time.monotonic()
    for entry in sorted(agents, key=lambda a: a.name):
        metrics = entry.metrics or {}
        rate, errors, p50 = activity(metrics)
        host = parse_host_metrics(metrics)  # known figures only, each within its bounds
        colour = _COLOURS.get(entry.status, "white")
        status = entry.status + (f" ({entry.error_code})" if entry.error_code else "")
        live = entry.status == ACTIVE
        state = liveliness(entry, incidents, now).text()
        if entry.misbehaving(now):
            # Its last status was refused (docs/liveness.md): said, never hidden.
            colour, status = "red", f"REJECTED, last {status}" if entry.seen else "REJECTED"
            state = f"refused: {entry.rejected}"
            live = False
        table.add_row(
            shown(entry.name),
            str(entry.id),
            f"[{colour}]{shown(status)}[/]",
            str(entry.epoch) if entry.epoch >= 0 else "-",
            shown(state, 200),
            # The agent's own counts (docs/metrics.md), from its last heartbeat.
            rate if live else "-",
            errors if live else "-",
            p50 if live else "-",
            # A down agent's last figures would read as current: show them only while live.
            # An idle agent uses a fraction of a percent: one decimal shows it.
            _percent(host.get("process_cpu_percent"), 1) if live else "-",
            _mebibytes(host.get("process_rss_bytes")) if live else "-",
            _percent(host.get("cpu_percent")) if live else "-",
            _percent(host.get("memory_percent")) if live else "-",
            _percent(host.get("disk_percent")) if live else "-",
            in_flight_text(in_flight(metrics)) if live else "-",  # served now, by state
            shown(", ".join(entry.commands)),
        )
    return table


def status_row(entry: AgentLiveness, incidents: Sequence[Incident], now: float) -> dict[str, Any]:
    """Return one agent's status as JSON-ready data, with how long it has been down."""
    row = entry.as_dict(now)
    row.update(liveliness(entry, incidents, now).as_dict())
    row["in_flight"] = in_flight(entry.metrics) if entry.status == ACTIVE else None
    if entry.status != ACTIVE:
        row["heartbeat_age_s"] = None  # only a live agent has a heartbeat age
    return row


def _from_console(
    args: argparse.Namespace, path: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """Ask the operator's console, when one runs for this config; None to look in-process.

    A look of one's own is no operator login (looks.py): no console is started for it.
    With the operator's config and a console running, its live view answers at once
    (docs/operations.md, "The operator's console").
    """
    from ._home import ConsoleUnreachable, one_shot_wanted, reach

    if one_shot_wanted(False):
        return None
    try:
        config = config_path(args.config)
    except ConfigError:
        return None

    async def ask() -> dict[str, Any] | None:
        try:
            client = await reach(config, start=False)
            status, found = await client.call("POST", path, body)
        except (ConsoleUnreachable, ConfigError, OSError, asyncio.IncompleteReadError):
            return None
        return found if status == 200 else None

    return asyncio.run(ask())


def cmd_status(args: argparse.Namespace) -> int:
    """Print the liveness of every agent whose status this identity may read."""
    columns = shutil.get_terminal_size((200, 24)).columns
    width = columns if sys.stdout.isatty() else max(columns, 200)  # as _wide_console()
    body = {"wait": args.wait, "json": args.json, "width": width, "color": sys.stdout.isatty()}
    found = _from_console(args, "/v1/status", body)
    if found is not None:
        if args.json:
            print_json(found.get("document"))
        else:
            sys.stdout.write(str(found.get("text", "")))
        return 0
    reader = load_reader(args.config)
    links = reader.link_watch()

    async def run() -> int:
        # The war room (when this identity may read it) dates each loss: "down for".
        async with observing(reader, warroom=reader.warroom, links=links) as look:
            await look.settled(args.wait, partial="status")
            observer = look.observer
            observer.view.refresh()
            agents = shown_agents(observer)
            if links is not None:
                agents = links.overlay(agents)
            incidents = list(observer.incidents.values())
            if args.json:
                now = time.monotonic()
                ordered = sorted(agents, key=lambda a: a.name)
                document = {
                    "identity": {"kind": reader.kind, "name": reader.name, "id": reader.id},
                    "agents": [status_row(a, incidents, now) for a in ordered],
                }
                if links is not None:
                    document["links"] = _link_rows(links)
                print_json(document)
            else:
                title = f"vox fleet status, as seen by {shown(reader.name)} ({reader.kind})"
                _wide_console().print(status_table(agents, title, incidents))
        return 0

    return asyncio.run(run())


def shown_agents(observer: FleetObserver) -> list[AgentLiveness]:
    """Return the agents a view lists: every one seen, and every one whose status was refused."""
    return [a for a in observer.view.agents() if a.seen or a.misbehaving()]


def _link_rows(links: LinkWatch) -> list[dict[str, Any]]:
    rows = []
    for link in links.map.links:
        up = links.up.get(link.id)
        state = "UNKNOWN" if up is None else ("UP" if up else "DOWN")
        rows.append({"site": link.site, "id": str(link.id), "state": state})
    return rows


def status_tree(reader: Reader, observer: FleetObserver, links: LinkWatch | None = None) -> Tree:
    """Draw the fleet as masters and children from what the statuses say."""
    seen = shown_agents(observer)
    agents = {a.id: a for a in (seen if links is None else links.overlay(seen))}
    incidents = list(observer.incidents.values())
    now = time.monotonic()

    def label(entry: AgentLiveness) -> str:
        colour = _COLOURS.get(entry.status, "white")
        code = f" {entry.error_code}" if entry.error_code else ""
        state = liveliness(entry, incidents, now).text()
        if entry.misbehaving(now):
            colour, code = "red", f"{code} REJECTED"
            state = f"refused: {entry.rejected}"
        figures = ""
        metrics = parse_host_metrics(entry.metrics)
        if entry.status == ACTIVE and metrics:
            figures = (
                f", cpu {_percent(metrics.get('process_cpu_percent'), 1)}% "
                f"rss {_mebibytes(metrics.get('process_rss_bytes'))} "
                f"(host cpu {_percent(metrics.get('cpu_percent'))}%)"
            )
        return (
            f"[{colour}]{shown(entry.name)} {entry.status}{shown(code)}[/] [dim](id: {entry.id}, "
            f"epoch {entry.epoch}, {shown(state, 200)}{figures})[/]"
        )

    top = agents.get(reader.top)
    if top is not None:
        tree = Tree(label(top))
    else:  # the operator, or a master whose status this identity may not read
        kind = "operator" if reader.kind == "operator" else "master"
        tree = Tree(f"[bold]{shown(reader.top_name)}[/] ({kind})")

    def grow(branch: Tree, parent: UUID, depth: int) -> None:
        children = [agents[a.id] for a in observer.view.get_children(parent) if a.id in agents]
        for entry in sorted(children, key=lambda a: a.name):
            if depth < 64:
                grow(branch.add(label(entry)), entry.id, depth + 1)

    grow(tree, reader.top, 0)
    for entry in agents.values():
        if not entry.seen:  # refused from its first status: nobody knows where it hangs
            tree.add(label(entry))
    if observer.incidents:
        tree.add(f"[red]war room: {len(observer.incidents)} open incident(s)[/]")
    for link in [] if links is None else links.down():
        tree.add(f"[red]site {shown(link.site)}: bridge link lost ({SITE_LINK_LOST})[/]")
    return tree


def cmd_watch(args: argparse.Namespace) -> int:
    """Show a live tree of the fleet until interrupted or --duration has passed."""
    reader = load_reader(args.config, "watch")
    links = reader.link_watch()

    async def run() -> int:
        async with observing(reader, warroom=reader.warroom, links=links) as look:
            await look.settled(1.0)  # then drawn live: whatever comes later shows as it comes
            observer = look.observer
            deadline = None if args.duration is None else time.monotonic() + args.duration
            with Live(
                status_tree(reader, observer, links), console=_wide_console(), refresh_per_second=2
            ) as live:
                while deadline is None or time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    observer.view.refresh()
                    live.update(status_tree(reader, observer, links))
        return 0

    return asyncio.run(run())


def incident_row(
    incident: Incident,
    names: Callable[[UUID], str],
    master_of: Callable[[UUID], UUID | None] = lambda _: None,
) -> dict[str, Any]:
    """Return a war-room post as JSON-ready data, with the names the statuses told.

    `rule_broken` says why a post breaks the war-room rule (an agent posts only about
    itself and its own children), judged by the masters the statuses told; else None.
    """
    row = incident.as_dict()
    row["source_name"] = names(incident.topic.source)
    row["subject_name"] = names(incident.topic.subject)
    row["rule_broken"] = rule_problem(incident.topic.source, incident.topic.subject, master_of)
    return row


def cmd_warroom(args: argparse.Namespace) -> int:
    """List open incidents, then follow new posts if asked."""
    if not args.follow:
        found = _from_console(args, "/v1/warroom", {"wait": args.wait})
        if found is not None:
            rows = [row for row in found.get("rows", []) if isinstance(row, dict)]
            _print_incidents(rows, as_json=args.json, title="open incidents")
            return 0
    reader = load_reader(args.config)

    async def run() -> int:
        async with observing(reader, warroom=True) as look:
            await look.settled(args.wait, partial="incident")
            observer = look.observer

            def names(agent_id: UUID) -> str:
                entry = observer.view.get(agent_id)
                return entry.name if entry is not None and entry.name else ""

            def master_of(agent_id: UUID) -> UUID | None:
                entry = observer.view.get(agent_id)
                return None if entry is None else entry.master_id

            rows = [incident_row(i, names, master_of) for i in observer.incidents.values()]
            rows.sort(key=lambda r: str(r["emitted_at"]))
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


def _print_incidents(rows: list[dict[str, Any]], *, as_json: bool, title: str | None) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row), flush=True)
        return
    console = _wide_console()
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
