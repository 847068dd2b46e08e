"""Brokers bridged into one fleet: who connects where, and exactly what crosses each bridge.

Each site broker originates one bridge to its upstream. What crosses it is derived
from the identities' own ACL rules, never listed by hand: a topic goes up when an
identity below the bridge may write it and one above may read it, and down in the
mirror case. The upstream broker gives the bridge's identity those topics only, so
a site speaks for its own agents and nobody else's (docs/federation.md).
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, TypeVar
from uuid import UUID, uuid5

from vox_mqtt.broker.acl import EXPLORER_NAME, Identity, Kind, Rule, fleet_identities
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.passwd import atomic_write
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet
from vox_mqtt.protocol.sitelinks import LINK_FILTER, Link, LinkMap, links_path
from vox_mqtt.protocol.sites import BrokerSpec, chain_up
from vox_mqtt.protocol.storm import (
    BRIDGE_RESTART_BASE,
    BRIDGE_RESTART_CAP,
    bridge_restart_timeout,
)

__all__ = [
    "BRIDGE_PREFIX",
    "Bridge",
    "BridgeTLS",
    "bridge_for",
    "bridge_id",
    "bridges",
    "broker_identities",
    "broker_spec",
    "intersect",
    "link_map",
    "link_owners",
    "link_path",
    "link_topic",
    "render_bridge_conf",
    "site_section",
    "sites_below",
    "sites_fleet_toml",
    "write_link_map",
]

BRIDGE_PREFIX: Final = "bridge-"
_BRIDGE_NS: Final = "vox-mqtt bridge "
T = TypeVar("T")


def _per_fleet(func: Callable[[Fleet], T]) -> Callable[[Fleet], T]:
    """Return func answered once per fleet object (the last one asked): a fleet is frozen.

    `vox agent render` asks a link map per agent: each walking every agent was quadratic
    for 10,000 of them (docs/performance.md, figure 7). Its answer is only read.
    """
    last: list[tuple[Fleet, T]] = []

    @functools.wraps(func)
    def once(fleet: Fleet) -> T:
        if last and last[0][0] is fleet:
            return last[0][1]
        value = func(fleet)
        last[:] = [(fleet, value)]
        return value

    return once


def bridge_id(fleet: Fleet, broker: str) -> UUID:
    """Return the id of the bridge a site broker opens upstream: stable per fleet and site."""
    return uuid5(fleet.operator_id, _BRIDGE_NS + broker)


def link_topic(bridge: UUID) -> str:
    """Return the retained topic on which a bridge's state ("1" up, "0" down) lives."""
    return topics.link(bridge)


@dataclass(frozen=True, kw_only=True)
class Bridge:
    """One site broker's bridge: its identity and the topics it carries each way."""

    site: str
    upstream: str
    id: UUID
    out_topics: tuple[str, ...]
    in_topics: tuple[str, ...]

    @property
    def name(self) -> str:
        """Return the identity's name (its credentials file on the upstream broker)."""
        return BRIDGE_PREFIX + self.site

    @property
    def link(self) -> str:
        """Return the notification topic."""
        return link_topic(self.id)

    def identity(self) -> Identity:
        """Return the upstream broker's account for this bridge: its topics and nothing else."""
        rules = [Rule(topic=t, write=True) for t in (*self.out_topics, self.link)]
        rules += [Rule(topic=t, read=True) for t in self.in_topics]
        return Identity(name=self.name, id=self.id, kind=Kind.BRIDGE, rules=tuple(rules))


def broker_spec(fleet: Fleet, name: str) -> BrokerSpec:
    """Return the declared broker called name; raise ConfigError naming the known ones."""
    return _spec(fleet, name)


def _spec(fleet: Fleet, name: str) -> BrokerSpec:
    for spec in fleet.brokers:
        if spec.name == name:
            return spec
    known = ", ".join(b.name for b in fleet.brokers) or "none: the fleet has one broker"
    raise ConfigError([f"--broker {name!r}: no such broker in the fleet ({known})"])


def sites_below(fleet: Fleet, broker: str) -> set[str]:
    """Return the broker and every broker whose chain of upstreams passes through it."""
    return {b.name for b in fleet.brokers if broker in chain_up(fleet.brokers, b.name)}


def link_path(fleet: Fleet, lower: str, upper: str) -> tuple[UUID, ...]:
    """Return the bridges a message crosses from broker lower up to broker upper."""
    path: list[UUID] = []
    for name in chain_up(fleet.brokers, lower):
        if name == upper:
            break
        path.append(bridge_id(fleet, name))
    return tuple(path)


def intersect(a: str, b: str) -> str | None:
    """Return the filter matching exactly the topics both filters match, or None."""
    la, lb = a.split("/"), b.split("/")
    out: list[str] = []
    for index in range(max(len(la), len(lb))):
        x = la[index] if index < len(la) else None
        y = lb[index] if index < len(lb) else None
        if x == "#":
            return "/".join(out + lb[index:])
        if y == "#":
            return "/".join(out + la[index:])
        if x is None or y is None:
            return None
        if x == "+":
            out.append(y)
        elif y == "+" or x == y:
            out.append(x)
        else:
            return None
    return "/".join(out)


def _base_identities(fleet: Fleet) -> list[tuple[str, Identity]]:
    """Return (broker, identity) for everyone but bridges and the explorer, with link reads."""
    root = fleet.root_broker
    assert root is not None
    reads: dict[UUID, list[Rule]] = defaultdict(list)
    reads[fleet.operator_id].append(Rule(topic=LINK_FILTER, read=True))
    # A master watches every bridge between it and each child: one down means unreachable.
    for link, pairs in _crossings(fleet).items():
        for master, _ in pairs:
            reads[master].append(Rule(topic=link_topic(link), read=True))
    # The one master that tells the war room about a lost link may post about it.
    for bridge, owner in link_owners(fleet).items():
        reads[owner].append(Rule(topic=topics.warroom(owner, bridge), write=True))
    result: list[tuple[str, Identity]] = []
    for identity in fleet_identities(fleet):
        # The operator and its looks (`vox status`, `vox watch`) use the root broker.
        broker = root if identity.kind is not Kind.AGENT else fleet.agent(identity.id).broker
        assert broker is not None
        extra = tuple(dict.fromkeys(reads.get(identity.id, ())))
        if identity.kind is Kind.LOOK:
            extra += (Rule(topic=LINK_FILTER, read=True),)
        result.append((broker, replace(identity, rules=identity.rules + extra)))
    return result


@_per_fleet
def _crossings(fleet: Fleet) -> dict[UUID, list[tuple[UUID, UUID]]]:
    """Return bridge -> the (master, child) pairs whose traffic crosses it."""
    root = fleet.root_broker
    pairs: dict[UUID, list[tuple[UUID, UUID]]] = defaultdict(list)
    for agent in fleet:
        master_id = fleet.master_of(agent.id)
        master_broker = root if agent.master_id is None else fleet.agent(master_id).broker
        assert agent.broker is not None
        assert master_broker is not None
        for link in link_path(fleet, agent.broker, master_broker):
            pairs[link].append((master_id, agent.id))
    return pairs


def link_owners(fleet: Fleet) -> dict[UUID, UUID]:
    """Return bridge -> the agent that posts its one incident: the highest master across it."""
    return dict(_link_owners(fleet))


@_per_fleet
def _link_owners(fleet: Fleet) -> dict[UUID, UUID]:
    owners: dict[UUID, UUID] = {}
    for bridge, pairs in _crossings(fleet).items():
        masters = {m for m, _ in pairs if m != fleet.operator_id}
        if masters:
            owners[bridge] = min(masters, key=lambda m: (fleet.depth_of(m), str(m)))
    return owners


def link_map(fleet: Fleet, identity: UUID) -> LinkMap | None:
    """Return the links an identity watches (None in a one-broker fleet)."""
    if not fleet.brokers:
        return None
    sites = {bridge_id(fleet, b.name): b.name for b in fleet.brokers if b.upstream is not None}
    owners = _link_owners(fleet)
    behind: Mapping[UUID, set[UUID]]
    if identity == fleet.operator_id:
        below = {bridge: sites_below(fleet, site) for bridge, site in sites.items()}
        behind = {bridge: {a.id for a in fleet if a.broker in below[bridge]} for bridge in sites}
    else:
        behind = _behind_per_master(fleet).get(identity, {})
    caps = _restart_caps(fleet)
    links = [
        Link(
            id=bridge,
            site=sites[bridge],
            behind=frozenset(agents),
            owner=owners.get(bridge) == identity,
            restart_cap=caps[sites[bridge]][1],
        )
        for bridge, agents in sorted(behind.items(), key=lambda kv: sites[kv[0]])
        if agents
    ]
    return LinkMap(links=tuple(links))


@_per_fleet
def _behind_per_master(fleet: Fleet) -> dict[UUID, dict[UUID, set[UUID]]]:
    """Return master -> bridge -> its children whose traffic crosses that bridge."""
    behind: dict[UUID, dict[UUID, set[UUID]]] = defaultdict(lambda: defaultdict(set))
    for bridge, pairs in _crossings(fleet).items():
        for master, child in pairs:
            behind[master][bridge].add(child)
    return behind


@_per_fleet
def _restart_caps(fleet: Fleet) -> dict[str, tuple[int, int]]:
    """Return bridge_restart of every site broker."""
    return {b.name: bridge_restart(fleet, b.name) for b in fleet.brokers if b.upstream is not None}


def bridge_restart(fleet: Fleet, site: str) -> tuple[int, int]:
    """Return (base, cap) of the restart_timeout of a site's bridge (protocol/storm.py).

    Sized to the agents behind every bridge into the same upstream: after that broker
    restarts, all of those bridges come back and carry their agents' births.
    """
    upstream = next(b.upstream for b in fleet.brokers if b.name == site)
    below: set[str] = set()
    for spec in fleet.brokers:
        if spec.upstream == upstream and spec.upstream is not None:
            below |= set(sites_below(fleet, spec.name))
    return bridge_restart_timeout(sum(1 for agent in fleet if agent.broker in below))


def write_link_map(fleet: Fleet, name: str, config: Path) -> Path | None:
    """Write NAME.links.json beside a rendered config; remove it for a one-broker fleet."""
    target = links_path(config)
    try:
        identity = fleet.agent(name).id
    except KeyError:
        identity = fleet.operator_id
    links = link_map(fleet, identity)
    if links is None:
        target.unlink(missing_ok=True)
        return None
    atomic_write(target, json.dumps(links.as_json(), indent=1) + "\n", mode=0o640)
    return target


def _crossing(
    writers: Iterable[Identity], readers: Iterable[Identity], kept: dict[str, None]
) -> None:
    """Add to kept each topic some writer may publish and some reader may receive."""
    index: dict[str, list[str]] = defaultdict(list)
    for reader in readers:
        for rule in reader.rules:
            if rule.read:
                levels = rule.topic.split("/")
                index[levels[1] if len(levels) > 1 else "#"].append(rule.topic)
    for writer in writers:
        for rule in writer.rules:
            if not rule.write:
                continue
            levels = rule.topic.split("/")
            key = levels[1] if len(levels) > 1 else "#"
            keys = (key, "+", "#") if key not in ("+", "#") else tuple(index)
            for candidate in (t for k in keys for t in index.get(k, ())):
                common = intersect(rule.topic, candidate)
                if common is not None:
                    kept.setdefault(common, None)


def _minimal(filters: Iterable[str]) -> tuple[str, ...]:
    """Return the filters, sorted, without those another one of them already covers."""
    groups: dict[str, list[str]] = defaultdict(list)
    for topic in filters:
        levels = topic.split("/")
        # Only filters that share these levels can cover each other in the VOX scheme.
        groups["/".join(levels[:3] if levels[1] in ("warroom", "link") else levels[:2])].append(
            topic
        )
    kept = [
        topic
        for group in groups.values()
        for topic in group
        if not any(other != topic and intersect(other, topic) == topic for other in group)
    ]
    return tuple(sorted(kept))


def bridges(fleet: Fleet) -> tuple[Bridge, ...]:
    """Return every bridge of the fleet, upstream ones first."""
    if not fleet.brokers:
        return ()
    placed = _base_identities(fleet)
    sites = [b for b in fleet.brokers if b.upstream is not None]
    sites.sort(key=lambda b: len(list(chain_up(fleet.brokers, b.name))))
    result: list[Bridge] = []
    for site in sites:
        assert site.upstream is not None
        below = sites_below(fleet, site.name)
        inside = [i for b, i in placed if b in below]
        outside = [i for b, i in placed if b not in below]
        # The links of bridges further down are written on brokers inside this one's reach.
        inside += [
            Identity(
                name=BRIDGE_PREFIX + name,
                id=bridge_id(fleet, name),
                kind=Kind.BRIDGE,
                rules=(Rule(topic=link_topic(bridge_id(fleet, name)), write=True),),
            )
            for name in below - {site.name}
        ]
        out: dict[str, None] = {}
        down: dict[str, None] = {}
        _crossing(inside, outside, out)
        _crossing(outside, inside, down)
        result.append(
            Bridge(
                site=site.name,
                upstream=site.upstream,
                id=bridge_id(fleet, site.name),
                out_topics=_minimal(out),
                in_topics=_minimal(down),
            )
        )
    return tuple(result)


def bridge_for(fleet: Fleet, site: str) -> Bridge | None:
    """Return the bridge a broker opens upstream, or None for the root broker."""
    _spec(fleet, site)
    return next((b for b in bridges(fleet) if b.site == site), None)


def broker_identities(
    fleet: Fleet, broker: str, *, explorer: bool = False, explorers: Iterable[str] = ()
) -> tuple[Identity, ...]:
    """Return the accounts of one broker: its agents, the bridges below, operator at the root.

    The explorers (the unnamed one with explorer=True, and each of `explorers`) log in at
    the root broker only: it is the one that sees every topic.
    """
    spec = _spec(fleet, broker)
    names = {a.name for a in fleet} | {fleet.operator_name}
    clashes = sorted(names & {BRIDGE_PREFIX + b.name for b in fleet.brokers})
    if clashes:
        raise ConfigError(
            [
                f"fleet: {n!r} names an agent and a bridge identity: rename the agent"
                for n in clashes
            ]
        )
    result = [i for b, i in _base_identities(fleet) if b == broker]
    result += [b.identity() for b in bridges(fleet) if b.upstream == broker]
    wanted = (*((EXPLORER_NAME,) if explorer else ()), *explorers)
    if spec.upstream is None and wanted:
        every = fleet_identities(fleet, explorers=wanted)
        result += [i for i in every if i.kind is Kind.EXPLORER]
    return tuple(result)


@dataclass(frozen=True, kw_only=True)
class BridgeTLS:
    """The files a site broker presents to its upstream's TLS listener."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def render_bridge_conf(
    bridge: Bridge,
    *,
    host: str,
    port: int,
    password: str | None,
    tls: BridgeTLS | None = None,
    keepalive: int = 10,
    restart: tuple[int, int] = (BRIDGE_RESTART_BASE, BRIDGE_RESTART_CAP),
) -> str:
    """Return the mosquitto.conf section of one site's bridge to its upstream."""
    lines = [
        "",
        f"# Bridge to the upstream broker {bridge.upstream!r}: exactly the topics that must",
        "# cross, derived from the fleet's ACL (docs/federation.md).",
        f"connection vox-{bridge.site}",
        f"address {host}:{port}",
        "bridge_protocol_version mqttv50",
        f"remote_clientid {bridge.id}",
        f"remote_username {bridge.id}",
    ]
    if password is not None and tls is None:
        lines.append(f"remote_password {password}")
    lines += [
        f"local_clientid vox-bridge-{bridge.site}",
        # A persistent session on both sides: QoS 1 messages queue through an outage.
        "cleansession false",
        "start_type automatic",
        f"keepalive_interval {keepalive}",
        # Mosquitto's decorrelated jitter from base to cap, the cap sized to the agents
        # whose births the upstream's bridges carry after its restart (docs/federation.md).
        f"restart_timeout {restart[0]} {restart[1]}",
        # "1" retained on connect, "0" as the will on the upstream: observers see a cut at once.
        "notifications true",
        "notifications_local_only false",
        f"notification_topic {bridge.link}",
        # The upstream only lets the bridge unsubscribe from what it may read.
        "bridge_attempt_unsubscribe false",
        "try_private false",
    ]
    if tls is not None:
        lines += [
            f"bridge_cafile {tls.ca_file}",
            f"bridge_certfile {tls.cert_file}",
            f"bridge_keyfile {tls.key_file}",
            "bridge_tls_version tlsv1.2",
            "bridge_insecure false",
        ]
    lines += [f"topic {t} out 1" for t in bridge.out_topics]
    lines += [f"topic {t} in 1" for t in bridge.in_topics]
    return "\n".join(lines) + "\n"


def site_section(
    fleet: Fleet, site: str, upstream_dir: Path | None, tls_dir: Path, *, keepalive: int = 10
) -> tuple[str, dict[str, bytes]]:
    """Return a site's bridge section and the TLS files (name -> bytes) it needs in tls_dir."""
    bridge = bridge_for(fleet, site)
    if bridge is None:
        return "", {}
    if upstream_dir is None:
        raise ConfigError(
            [
                f"--broker {site!r} bridges to {bridge.upstream!r}: render {bridge.upstream!r} "
                "first and pass its directory with --upstream-dir"
            ]
        )
    store = CredentialStore(upstream_dir)
    source = store.path
    if not store.has(bridge.name):
        raise ConfigError(
            [
                f"{source}: no credentials for the bridge of {site!r}: render {bridge.upstream!r} "
                "with the current fleet file, then this broker"
            ]
        )
    creds = store.get(bridge.name)
    if creds.username != str(bridge.id):
        raise ConfigError([f"{source}: the credentials are not the bridge of {site!r}"])
    files: dict[str, bytes] = {}
    tls = None
    if creds.tls:
        assert creds.ca_file is not None
        assert creds.cert_file is not None
        assert creds.key_file is not None
        names = {"bridge-ca.crt": creds.ca_file, "bridge.crt": creds.cert_file}
        names["bridge.key"] = creds.key_file
        try:
            files = {name: path.read_bytes() for name, path in names.items()}
        except OSError as exc:
            raise ConfigError([f"{exc.filename}: cannot read it: {exc.strerror}"]) from None
        tls = BridgeTLS(
            ca_file=tls_dir / "bridge-ca.crt",
            cert_file=tls_dir / "bridge.crt",
            key_file=tls_dir / "bridge.key",
        )
    text = render_bridge_conf(
        bridge,
        host=creds.host,
        port=creds.port,
        password=creds.password,
        tls=tls,
        keepalive=keepalive,
        restart=bridge_restart(fleet, site),
    )
    return text, files


def sites_fleet_toml(seed: str) -> str:
    """Return the seed fleet file spread over a core broker and two chained sites.

    The coordinator and specialist_a live on site plant-a (bridged to the core);
    specialist_b on plant-b, bridged to plant-a: two bridges from the operator.
    """
    brokers = (
        '[[brokers]]\nname = "core"\n\n'
        '[[brokers]]\nname = "plant-a"\nupstream = "core"\n\n'
        '[[brokers]]\nname = "plant-b"\nupstream = "plant-a"\n\n'
    )
    placed = seed.replace('name = "coordinator"\n', 'name = "coordinator"\nbroker = "plant-a"\n')
    placed = placed.replace(
        'name = "specialist_b"\n', 'name = "specialist_b"\nbroker = "plant-b"\n'
    )
    head, sep, agents = placed.partition("\n[[agents]]\n")
    return head + "\n" + brokers + sep.lstrip("\n") + agents
