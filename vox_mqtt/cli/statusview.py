"""What the read-only looks show: `vox status`'s rows and `vox watch`'s tree, from a look.

The looks log in as the identity of the config they are given (the operator's console
config, or an agent's daemon config) on a throw-away client id, and show whatever the
broker's ACL lets that identity read (cli/looks.py). The operator's console renders
`vox status` with the same functions from its live view (cli/console.py). The verbs'
parsers and their way through the console are in cli/ops.py, which loads this module only
when a verb looks for itself.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from rich.text import Text
from rich.tree import Tree

from vox_mqtt.console.safetext import plain, shown
from vox_mqtt.observe.metrics import parse_host_metrics, parse_snapshot, quantile
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, INACTIVE, STALE, AgentLiveness
from vox_mqtt.observe.summary import MISBEHAVING, SUMMARY_ABOVE, FleetSummary, summarise
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.protocol.sitelinks import (
    SITE_LINK_LOST,
    UNREACHABLE,
    LinkWatch,
)

from ._common import duration, out_console, print_json, status_width
from ._downtime import liveliness
from ._inflight import in_flight, in_flight_text
from .looks import Reader, load_reader, observing
from .statuslayout import GAP, cut, fit_parts, layout_status

__all__ = [
    "activity",
    "link_banner",
    "status_lines",
    "status_look",
    "status_row",
    "status_tree",
    "watch_label",
]

_COLOURS = {ACTIVE: "green", STALE: "yellow", INACTIVE: "red", UNREACHABLE: "red"}


# --- read-only looks: status, watch, warroom (who looks, and how: looks.py) -----------------


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


def open_incidents(entry: AgentLiveness, incidents: Sequence[Incident]) -> int:
    """Return how many open war-room incidents are about this agent."""
    return sum(1 for i in incidents if i.topic.subject == entry.id and not i.failure.resolved)


def status_cells(entry: AgentLiveness, incidents: Sequence[Incident], now: float) -> dict[str, str]:
    """Return one agent's cells of `vox status`, plain text by column key (statuslayout)."""
    metrics = entry.metrics or {}
    rate, errors, p50 = activity(metrics)
    host = parse_host_metrics(metrics)  # known figures only, each within its bounds
    live = entry.status == ACTIVE
    state, note = entry.status, "-"
    how = liveliness(entry, incidents, now)
    if how.heartbeat_age is not None:
        age = f"{duration(how.heartbeat_age)} ago"
    elif how.down_for is not None:
        age = f"down {'≤ ' if how.at_most else ''}{duration(how.down_for)}"
    else:
        age = "-"
    if entry.misbehaving(now):
        # Its last status was refused (docs/liveness.md): said, never hidden.
        state, live = "REJECTED", False
        note = f"refused: {entry.rejected}" + (f" (last {entry.status})" if entry.seen else "")
    count = open_incidents(entry, incidents)

    def figure(text: str) -> str:
        # A down agent's last figures would read as current: shown only while it is live.
        return text if live else "-"

    return {
        "name": plain(entry.name or str(entry.id)),
        "state": state,
        "code": plain(entry.error_code or "-"),
        "age": age,
        "incidents": str(count) if count else "-",
        "in_flight": figure(in_flight_text(in_flight(metrics))),  # served now, by state
        "epoch": str(entry.epoch) if entry.epoch >= 0 else "-",
        # The agent's own counts (docs/metrics.md), from its last heartbeat.
        "rate": figure(rate),
        "errors": figure(errors),
        "p50": figure(p50),
        # An idle agent uses a fraction of a percent: one decimal shows it.
        "cpu": figure(_percent(host.get("process_cpu_percent"), 1)),
        "rss": figure(_mebibytes(host.get("process_rss_bytes"))),
        "host_cpu": figure(_percent(host.get("cpu_percent"))),
        "host_mem": figure(_percent(host.get("memory_percent"))),
        "disk": figure(_percent(host.get("disk_percent"))),
        "id": str(entry.id),
        "commands": plain(", ".join(entry.commands) or "-"),
        "note": plain(note, 300),
    }


def status_lines(
    agents: list[AgentLiveness],
    incidents: Sequence[Incident],
    width: int | None,
    now: float | None = None,
) -> list[Text]:
    """Return `vox status` as lines for a terminal `width` cells wide (None: --wide)."""
    now = time.monotonic() if now is None else now
    ordered = sorted(agents, key=lambda a: (a.name, str(a.id)))
    laid = layout_status([status_cells(a, incidents, now) for a in ordered], width)
    lines = [Text(laid.lines()[0], style="bold")]
    state_at = [c.key for c in laid.columns].index("state")
    for cells in laid.rows:
        colour = _COLOURS.get(cells[state_at], "red" if cells[state_at] == "REJECTED" else "")
        pieces = laid.padded(cells)
        line = Text()
        for index, piece in enumerate(pieces):
            if index:
                line.append(" " * GAP)
            line.append(piece, style=colour if index == state_at else "")
        line.rstrip()
        lines.append(line)
    return lines


def status_row(entry: AgentLiveness, incidents: Sequence[Incident], now: float) -> dict[str, Any]:
    """Return one agent's status as JSON-ready data, with how long it has been down."""
    row = entry.as_dict(now)
    row.update(liveliness(entry, incidents, now).as_dict())
    row["in_flight"] = in_flight(entry.metrics) if entry.status == ACTIVE else None
    if entry.status != ACTIVE:
        row["heartbeat_age_s"] = None  # only a live agent has a heartbeat age
    return row


def status_look(args: argparse.Namespace) -> int:
    """Print the liveness of every agent whose status this identity may read, from a look."""
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
                width = status_width(args.wide)
                title = f"vox fleet status, as seen by {plain(reader.name)} ({reader.kind})"
                console = out_console()
                console.print(Text(cut(title, width or len(title))), crop=False)
                for line in status_lines(agents, incidents, width):
                    console.print(line, crop=False)
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


def _tree_order(
    reader: Reader, observer: FleetObserver, agents: dict[UUID, AgentLiveness]
) -> list[tuple[int, AgentLiveness]]:
    """Return (depth, agent) from the top of the tree down, children by name."""
    order: list[tuple[int, AgentLiveness]] = []
    top = agents.get(reader.top)
    if top is not None:
        order.append((0, top))

    # Each agent's children, found in one pass: asking the view per agent (get_children)
    # walks every agent each time, 10^8 steps for a 10,000-agent fleet on every frame.
    children_of: dict[UUID | None, list[AgentLiveness]] = {}
    for seen in observer.view.agents():
        if seen.id in agents:
            children_of.setdefault(seen.master_id, []).append(agents[seen.id])

    def grow(parent: UUID, depth: int) -> None:
        for entry in sorted(children_of.get(parent, ()), key=lambda a: a.name):
            if depth < 64:
                order.append((depth + 1, entry))
                grow(entry.id, depth + 1)

    grow(reader.top, 0)
    placed = {entry.id for _, entry in order}
    # Refused from its first status: nobody knows where it hangs.
    order += [(1, entry) for entry in agents.values() if entry.id not in placed]
    return order


def watch_label(
    entry: AgentLiveness,
    incidents: Sequence[Incident],
    now: float,
    room: int | None,
    *,
    unknown_since: str | None = None,
) -> tuple[str, str, str]:
    """Return one agent of `vox watch` as (colour, its name and state, the rest), within
    `room` cells (None: whole): the rest keeps what fits, whole (statuslayout.fit_parts).

    unknown_since: the look's link to the broker is down since then: nothing is known now
    (docs/operations.md), so no state and no age, only the name and that.
    """
    name = plain(entry.name or str(entry.id))
    if unknown_since is not None:
        head, tail = fit_parts(f"{name} unknown since {unknown_since}", [], room)
        return "dim", head, tail
    colour = _COLOURS.get(entry.status, "white")
    code = f" {plain(entry.error_code)}" if entry.error_code else ""
    state = liveliness(entry, incidents, now).text()
    if entry.misbehaving(now):
        colour, code = "red", f"{code} REJECTED"
        state = f"refused: {plain(entry.rejected, 200)}"
    parts = [state]
    count = open_incidents(entry, incidents)
    if count:
        parts.append(f"{count} open incident" + ("s" if count > 1 else ""))
    parts.append(f"epoch {entry.epoch}")
    metrics = parse_host_metrics(entry.metrics)
    if entry.status == ACTIVE and metrics:
        parts.append(
            f"cpu {_percent(metrics.get('process_cpu_percent'), 1)}% "
            f"rss {_mebibytes(metrics.get('process_rss_bytes'))} "
            f"(host cpu {_percent(metrics.get('cpu_percent'))}%)"
        )
    parts.append(f"id: {entry.id}")
    head, tail = fit_parts(f"{name} {entry.status}{code}", parts, room)
    return colour, head, tail


# Rich draws each level of a tree 4 cells further right.
_GUIDE = 4


def status_tree(
    reader: Reader,
    observer: FleetObserver,
    links: LinkWatch | None = None,
    width: int | None = None,
    *,
    unknown_since: str | None = None,
) -> Tree:
    """Draw the fleet as masters and children from what the statuses say, each line
    within `width` cells (None: whole)."""
    seen = shown_agents(observer)
    agents = {a.id: a for a in (seen if links is None else links.overlay(seen))}
    incidents = list(observer.incidents.values())
    now = time.monotonic()

    def label(entry: AgentLiveness, depth: int) -> Text:
        room = None if width is None else max(8, width - _GUIDE * depth)
        colour, head, tail = watch_label(entry, incidents, now, room, unknown_since=unknown_since)
        return Text.assemble((head, colour), (tail, "dim"))

    if len(agents) > SUMMARY_ABOVE:
        # Too many to draw: the counts, the worst first (docs/operations.md).
        lines = fleet_summary(agents.values(), links, now).lines()
        if unknown_since is not None:
            lines = [f"{len(agents)} agents, every one unknown since {unknown_since}"]
        lines = lines if width is None else [cut(text, width) for text in lines]
        summary = Tree(Text(lines[0], style="bold"))
        for text in lines[1:]:
            summary.add(Text(text))
        if observer.incidents:
            summary.add(f"[red]war room: {len(observer.incidents)} open incident(s)[/]")
        return summary
    order = _tree_order(reader, observer, agents)
    if order and order[0][1].id == reader.top:
        tree = Tree(label(order[0][1], 0))
        order = order[1:]
    else:  # the operator, or a master whose status this identity may not read
        kind = "operator" if reader.kind == "operator" else "master"
        tree = Tree(Text.assemble((plain(reader.top_name), "bold"), f" ({kind})"))
    branches: dict[int, Tree] = {0: tree}
    for depth, entry in order:
        parent = branches.get(depth - 1, tree)
        branches[depth] = parent.add(label(entry, depth))
    if observer.incidents:
        tree.add(f"[red]war room: {len(observer.incidents)} open incident(s)[/]")
    for link in [] if links is None else links.down():
        tree.add(f"[red]site {shown(link.site)}: bridge link lost ({SITE_LINK_LOST})[/]")
    return tree


def fleet_summary(
    agents: Iterable[AgentLiveness], links: LinkWatch | None, now: float
) -> FleetSummary:
    """Summarise the agents by state and site (observe/summary.py)."""
    sites = {} if links is None else {a: k.site for k in links.map.links for a in k.behind}
    return summarise(
        (
            plain(entry.name or str(entry.id)),
            MISBEHAVING if entry.misbehaving(now) else entry.status,
            sites.get(entry.id),
        )
        for entry in agents
    )


def _clock() -> str:
    return datetime.now().strftime("%H:%M:%S")


def link_banner(since: str) -> str:
    """Say that the look's link to the broker is down: nothing shown is known now."""
    return f"broker link down since {since}, retrying: every agent unknown since {since}"
