"""The read-only looks: `vox status`, `watch` and `warroom`.

`status`, `watch` and `warroom` are read-only: they log in as the identity of the config
they are given (the operator's console config, or an agent's daemon config) on a
throw-away client id, and show whatever the broker's ACL lets that identity read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.tree import Tree

from vox_mqtt.broker.passwd import Credentials, load_credentials
from vox_mqtt.console.safetext import shown
from vox_mqtt.fleet.config import (
    BrokerSection,
    SigningSection,
    load_console_config,
    load_daemon_config,
)
from vox_mqtt.fleet.explorer import load_explorer_config
from vox_mqtt.observe.metrics import parse_host_metrics, parse_snapshot, quantile
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, INACTIVE, STALE, AgentLiveness
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.observe.warroomguard import rule_problem
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError, SubscriptionRefused
from vox_mqtt.protocol.sitelinks import (
    SITE_LINK_LOST,
    UNREACHABLE,
    LinkMap,
    LinkWatch,
    parse_link_topic,
)
from vox_mqtt.transport.session import BrokerSettings, Session

from ._common import add_config_option, config_path, out_console, print_json
from ._downtime import liveliness
from ._inflight import in_flight, in_flight_text

__all__ = ["Reader", "load_reader", "register"]

_COLOURS = {ACTIVE: "green", STALE: "yellow", INACTIVE: "red", UNREACHABLE: "red"}
_CONNECT_TIMEOUT = 5.0  # a read-only look should say "unreachable" quickly


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator verbs."""

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help)
        add_config_option(parser)
        return parser

    status = verb("status", "show the liveness of every agent one may see")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--wait", type=float, default=3.0, help="seconds to wait for retained statuses (default 3)"
    )
    status.set_defaults(func=cmd_status)

    watch = verb("watch", "live tree of the fleet coloured by health")
    watch.add_argument("--duration", type=float, default=None, help="stop after N seconds")
    watch.set_defaults(func=cmd_watch)

    warroom = verb("warroom", "list the open war-room incidents")
    warroom.add_argument("--follow", action="store_true", help="then print new posts as they come")
    warroom.add_argument("--duration", type=float, default=None, help="stop following after N s")
    warroom.add_argument("--json", action="store_true", help="one JSON object per line")
    warroom.set_defaults(func=cmd_warroom)


# --- read-only looks: status, watch, warroom -------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Reader:
    """Who a read-only look logs in as, and where it sits in the tree."""

    kind: str  # "operator", "explorer" or "agent"
    name: str
    id: UUID
    top: UUID  # the tree is drawn from here: the operator, or the agent's master
    top_name: str
    broker: BrokerSettings
    # The defaults are a look at the whole fleet (the operator's or the explorer's).
    peers: tuple[UUID, ...] = ()  # statuses an agent reads (for a broker refusing wildcards)
    warroom: bool = True  # whether this identity is meant to read the war room
    stale_after: float = 3.0
    # The bridge links this identity watches, from NAME.links.json (docs/federation.md).
    links: LinkMap | None = None

    def exact_liveness(self) -> list[str]:
        """Return an agent's own liveness topics, its master's presence, its children's."""
        me, master, *children = self.peers
        return topics.liveness_topics(me, master, children, own=True)

    def link_watch(self) -> LinkWatch | None:
        """Return a fresh watch of this reader's links, or None in a one-broker fleet."""
        return None if self.links is None else LinkWatch(self.links)


def _credentials(password_file: Path | None, base: Path) -> Credentials | None:
    if password_file is None:
        return None
    path = password_file if password_file.is_absolute() else base / password_file
    return load_credentials(path)


def _as_look(
    broker: BrokerSettings, creds: Credentials | None, purpose: str, base: Path
) -> BrokerSettings:
    """Log in as the operator's identity for this kind of look, when the broker rendered one."""
    look = None if creds is None else creds.look(purpose)
    if look is None:
        return broker

    def local(path: Path | None) -> Path | None:
        return None if path is None or path.is_absolute() else base / path

    return replace(
        broker,
        username=look.username,
        password=look.password,
        client_id=look.username,
        cert_file=local(look.cert_file) if broker.cert_file is not None else None,
        key_file=local(look.key_file) if broker.key_file is not None else None,
    )


def _look_client_id(identity: UUID) -> str:
    """Return a fresh client id for one look, so that it takes over no other session."""
    return f"{identity}-status-{secrets.token_hex(4)}"


def _look_broker(
    section: BrokerSection, signing: SigningSection | None, identity: UUID, base: Path
) -> BrokerSettings:
    """Return how a look of this identity logs in: its own client id, read-only, verifying."""
    broker = _read_only(section.settings(_look_client_id(identity), base=base))
    if signing is None:
        return broker
    return replace(broker, signing=replace(signing.signing(base), key=None))  # it signs nothing


def load_reader(given: Path | None, purpose: str = "status") -> Reader:
    """Read an operator, explorer or agent config; the look logs in with no session."""
    path = config_path(given)
    try:
        kind = tomllib.loads(path.read_text(encoding="utf-8")).get("kind", "agent")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        kind = "operator"  # let the loader say what is wrong with the file
    base = path.absolute().parent
    if kind == "explorer":
        explorer = load_explorer_config(path)
        e = explorer.explorer
        return Reader(
            kind="explorer",
            name=e.name,
            id=e.id,
            top=e.operator_id,
            top_name=e.operator_name,
            broker=_look_broker(explorer.broker, explorer.signing, e.id, base),
        )
    if kind == "agent":
        daemon = load_daemon_config(path)
        a = daemon.agent
        creds = _credentials(daemon.broker.password_file, base)
        if creds is not None and creds.client_id_locked:
            raise ConfigError(
                [
                    f"{path}: the broker locks client ids to usernames, so a look as agent "
                    f"{a.name} would take over its daemon's session: look with the operator's "
                    "console config instead"
                ]
            )
        return Reader(
            kind="agent",
            name=a.name,
            id=a.id,
            top=a.master_id,
            top_name=a.master_name,
            peers=(a.id, a.master_id, *a.children),
            warroom=a.watch_warroom,
            stale_after=a.stale_after,
            broker=_look_broker(daemon.broker, daemon.signing, a.id, base),
            links=_links_beside(path),
        )
    console = load_console_config(path)
    op = console.operator
    broker = _look_broker(console.broker, console.signing, op.id, base)
    broker = _as_look(broker, _credentials(console.broker.password_file, base), purpose, base)
    return Reader(
        kind="operator",
        name=op.name,
        id=op.id,
        top=op.id,
        top_name=op.name,
        broker=broker,
        links=_links_beside(path),
    )


def _links_beside(path: Path) -> LinkMap | None:
    try:
        return LinkMap.beside(path)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None


def _read_only(broker: BrokerSettings) -> BrokerSettings:
    # No session left behind on the broker, and a quick answer when it is not there.
    return replace(
        broker,
        session_expiry=0,
        connect_timeout=min(broker.connect_timeout, _CONNECT_TIMEOUT),
        reconnect_max=5.0,
    )


@contextlib.asynccontextmanager
async def observing(
    reader: Reader,
    *,
    warroom: bool,
    links: LinkWatch | None = None,
    on_session: Callable[[Session], None] | None = None,
) -> AsyncIterator[FleetObserver]:
    """Log in as the reader and keep a FleetObserver (and the link watch) up to date."""
    observer = FleetObserver(stale_after=reader.stale_after, signing=reader.broker.signing)
    link_topics = [] if links is None else links.map.topics
    wanted = [*topics.LIVENESS_FILTERS, *([topics.WARROOM_FILTER] if warroom else []), *link_topics]
    try:
        session = await _connect(reader.broker, wanted)
    except SubscriptionRefused:
        if reader.kind != "agent":
            raise
        # The dynsec plugin refuses a wildcard it does not grant: ask for each topic instead.
        exact = reader.exact_liveness()
        exact += [topics.WARROOM_FILTER] if warroom and reader.warroom else []
        session = await _connect(reader.broker, exact + link_topics)
    try:
        if session.session_present:
            # A fresh client id never has a session: this broker replaced it with the username.
            print(
                f"vox: warning: the broker gave this look the MQTT session of {reader.name}: "
                "it locks client ids to usernames, so a running client of that identity "
                "was disconnected by it — see docs/broker.md",
                file=sys.stderr,
            )
        if on_session is not None:
            on_session(session)
        pump = asyncio.ensure_future(_pump(session, observer, links))
        try:
            yield observer
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    finally:
        await session.__aexit__(None, None, None)


async def _connect(broker: BrokerSettings, filters: Sequence[str]) -> Session:
    session = Session(broker, subscriptions=filters)
    await session.__aenter__()
    return session


async def _pump(session: Session, observer: FleetObserver, links: LinkWatch | None) -> None:
    async for inbound in session.messages():
        if links is not None and parse_link_topic(inbound.topic) is not None:
            links.take(inbound.topic, inbound.payload)
            continue
        observer.take(inbound)


async def settle(observer: FleetObserver, limit: float, quiet: float = 0.3) -> None:
    """Wait until retained messages stop arriving (quiet seconds), at most limit seconds."""
    deadline = time.monotonic() + limit
    seen = -1
    while time.monotonic() < deadline:
        count = observer.messages
        if count == seen and count > 0:
            return
        seen = count
        await asyncio.sleep(min(quiet, max(0.0, deadline - time.monotonic())))


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


def cmd_status(args: argparse.Namespace) -> int:
    """Print the liveness of every agent whose status this identity may read."""
    reader = load_reader(args.config)
    links = reader.link_watch()

    async def run() -> int:
        # The war room (when this identity may read it) dates each loss: "down for".
        async with observing(reader, warroom=reader.warroom, links=links) as observer:
            await settle(observer, args.wait)
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
        async with observing(reader, warroom=reader.warroom, links=links) as observer:
            await settle(observer, 1.0)
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
    reader = load_reader(args.config)

    async def run() -> int:
        async with observing(reader, warroom=True) as observer:
            await settle(observer, 2.0)

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
