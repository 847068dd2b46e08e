"""Read-only looks: who a look logs in as (`Reader`), and a logged-in look (`observing`)
that knows when the broker's retained messages have all come (docs/broker.md)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from uuid import UUID

from vox_mqtt.broker.passwd import Credentials, load_credentials
from vox_mqtt.fleet.config import (
    BrokerSection,
    SigningSection,
    load_console_config,
    load_daemon_config,
)
from vox_mqtt.fleet.explorer import load_explorer_config
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import FleetView
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError, SubscriptionRefused
from vox_mqtt.protocol.sitelinks import LinkMap, LinkWatch, parse_link_topic
from vox_mqtt.transport.session import BrokerSettings, Session

from ._common import config_path

__all__ = ["Look", "Reader", "load_reader", "observing"]

_CONNECT_TIMEOUT = 5.0  # a read-only look should say "unreachable" quickly
_RECONNECT_MAX = 5.0  # and come back soon after its broker does


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
        # At most the config's cap, and never below its first try's window.
        reconnect_max=max(broker.reconnect_min, min(broker.reconnect_max, _RECONNECT_MAX)),
    )


@dataclass(frozen=True)
class Look:
    """A read-only look that is logged in: what it has seen, and the session it reads on."""

    observer: FleetObserver
    session: Session

    @property
    def view(self) -> FleetView:
        """Return the statuses seen so far."""
        return self.observer.view

    async def settled(self, limit: float, *, partial: str | None = None) -> bool:
        """Wait until every retained message the look subscribed to is taken, at most limit
        seconds; say so on stderr (naming what may be missing) when the limit came first."""
        if await self.session.caught_up(limit):
            return True
        if partial is not None:
            print(
                f"vox: warning: the broker had not sent every retained {partial} within "
                f"{limit:g}s: this list may miss some (wait longer with --wait; a broker that "
                "drops them needs the queue `vox broker render` sizes: docs/broker.md)",
                file=sys.stderr,
            )
        return False


@contextlib.asynccontextmanager
async def observing(
    reader: Reader, *, warroom: bool, links: LinkWatch | None = None
) -> AsyncIterator[Look]:
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
        pump = asyncio.ensure_future(_pump(session, observer, links))
        try:
            yield Look(observer, session)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    finally:
        await session.__aexit__(None, None, None)


async def _connect(broker: BrokerSettings, filters: Sequence[str]) -> Session:
    session = Session(broker, subscriptions=filters, mark_retained_end=True)
    await session.__aenter__()
    return session


async def _pump(session: Session, observer: FleetObserver, links: LinkWatch | None) -> None:
    async for inbound in session.messages():
        if links is not None and parse_link_topic(inbound.topic) is not None:
            links.take(inbound.topic, inbound.payload)
            continue
        observer.take(inbound)
