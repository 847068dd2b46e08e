"""The fleet file's brokers: one root broker, sites bridged upstream, and where each agent lives.

A fleet without `[[brokers]]` has one broker and nothing here applies. With them,
every agent lives on exactly one broker (its own `broker = NAME`, else its master's,
and the root agent defaults to the root broker), and a master's broker must be the
agent's own or one upstream of it: bridges only ever carry a master's traffic down
its own chain of brokers (docs/federation.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

__all__ = [
    "BrokerSpec",
    "Placement",
    "broker_lines",
    "parse_brokers",
    "place_agents",
]

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HOST: Final = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,253}")
_KEYS: Final = frozenset({"name", "host", "port", "tls_port", "upstream"})


@dataclass(frozen=True, kw_only=True)
class BrokerSpec:
    """One Mosquitto of the fleet as the file declares it."""

    name: str
    host: str = "127.0.0.1"
    port: int = 1883
    tls_port: int = 8883
    upstream: str | None = None
    line: int = 0


@dataclass(frozen=True, kw_only=True)
class Placement:
    """One agent as placement needs it: ids, the master, the broker it names, its line."""

    name: str
    id: UUID
    master_id: UUID | None
    broker: str | None
    line: int = 0


def broker_lines(text: str) -> list[int]:
    """Return the line number of each `[[brokers]]` header, in order."""
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip().replace(" ", "").startswith("[[brokers]]")
    ]


def _port(value: Any, default: int) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        return None
    return value


def parse_brokers(
    raw: Any, lines: Sequence[int], source: str, problems: list[str]
) -> tuple[BrokerSpec, ...]:
    """Validate the `[[brokers]]` array; append one line per problem; return the good ones."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        problems.append(f"{source}: `brokers` must be [[brokers]] tables")
        return ()
    specs: list[BrokerSpec] = []
    for index, item in enumerate(raw):
        line = lines[index] if index < len(lines) else 0
        where = f"{source}:{line}" if line else source
        if not isinstance(item, dict):
            problems.append(f"{where}: broker #{index + 1} is not a table")
            continue
        name = item.get("name")
        label = f"broker {name!r}" if isinstance(name, str) else f"broker #{index + 1}"
        for key in sorted(set(item) - _KEYS):
            problems.append(f"{where}: {label}: unknown key {key!r}")
        ok = True
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(
                f"{where}: {label}: name must be letters, digits, '.', '_' or '-' (got {name!r})"
            )
            ok = False
        host = item.get("host", "127.0.0.1")
        if not isinstance(host, str) or not _HOST.fullmatch(host):
            problems.append(f"{where}: {label}: host must be a host name or address (got {host!r})")
            ok = False
        port, tls_port = _port(item.get("port"), 1883), _port(item.get("tls_port"), 8883)
        for key, value in (("port", port), ("tls_port", tls_port)):
            if value is None:
                problems.append(f"{where}: {label}: {key} must be from 1 to 65535")
                ok = False
        if port is not None and port == tls_port:
            problems.append(f"{where}: {label}: port and tls_port must differ (both {port})")
            ok = False
        upstream = item.get("upstream")
        if upstream is not None and (not isinstance(upstream, str) or not upstream):
            problems.append(f"{where}: {label}: upstream must name a broker (got {upstream!r})")
            ok = False
        if ok and isinstance(name, str) and port is not None and tls_port is not None:
            specs.append(
                BrokerSpec(
                    name=name,
                    host=str(host),
                    port=port,
                    tls_port=tls_port,
                    upstream=upstream,
                    line=line,
                )
            )
    _check_brokers(specs, source, problems)
    return tuple(specs)


def _at(spec: BrokerSpec, source: str) -> str:
    return f"{source}:{spec.line}" if spec.line else source


def _check_brokers(specs: list[BrokerSpec], source: str, problems: list[str]) -> None:
    by_name: dict[str, BrokerSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            first = by_name[spec.name]
            problems.append(
                f"{_at(spec, source)}: broker {spec.name!r}: the name is already used "
                f"(line {first.line})"
            )
        by_name.setdefault(spec.name, spec)
    for spec in specs:
        if spec.upstream is None:
            continue
        if spec.upstream == spec.name:
            problems.append(f"{_at(spec, source)}: broker {spec.name!r}: is its own upstream")
        elif spec.upstream not in by_name:
            problems.append(
                f"{_at(spec, source)}: broker {spec.name!r}: upstream {spec.upstream!r} "
                "is not a declared broker"
            )
        else:
            cycle = _cycle(spec, by_name)
            if cycle:
                chain = " -> ".join(repr(n) for n in (*cycle, cycle[0]))
                relation = "is on" if spec.name in cycle else "hangs below"
                problems.append(
                    f"{_at(spec, source)}: broker {spec.name!r}: {relation} the upstream cycle "
                    f"{chain} and never reaches a root broker"
                )
    roots = [spec for spec in by_name.values() if spec.upstream is None]
    if len(roots) > 1:
        names = ", ".join(f"{s.name!r} (line {s.line})" for s in roots)
        problems.append(
            f"{source}: several root brokers ({names}): exactly one broker has no upstream"
        )
    if not roots and by_name:
        problems.append(f"{source}: no root broker: exactly one broker must have no upstream")


def _cycle(spec: BrokerSpec, by_name: dict[str, BrokerSpec]) -> list[str]:
    path: list[str] = []
    current: BrokerSpec | None = spec
    while current is not None and current.name not in path:
        if current.upstream == current.name:
            return []
        path.append(current.name)
        current = None if current.upstream is None else by_name.get(current.upstream)
    if current is None:
        return []
    return path[path.index(current.name) :]


def chain_up(brokers: Sequence[BrokerSpec], name: str) -> Iterator[str]:
    """Yield name, its upstream, that one's upstream... up to the root broker."""
    by_name = {b.name: b for b in brokers}
    seen: set[str] = set()
    current: str | None = name
    while current is not None and current not in seen and current in by_name:
        seen.add(current)
        yield current
        current = by_name[current].upstream


def place_agents(
    agents: Sequence[Placement],
    brokers: Sequence[BrokerSpec],
    source: str,
    problems: list[str],
) -> dict[UUID, str | None]:
    """Return agent id -> the broker it lives on (None for a one-broker fleet)."""
    where = {a.id: (f"{source}:{a.line}" if a.line else source) for a in agents}
    if not brokers:
        for agent in agents:
            if agent.broker is not None:
                problems.append(
                    f"{where[agent.id]}: agent {agent.name!r}: broker {agent.broker!r} is "
                    "not declared (the file has no [[brokers]])"
                )
        return {agent.id: None for agent in agents}
    names = {b.name for b in brokers}
    roots = [b.name for b in brokers if b.upstream is None]
    by_id = {a.id: a for a in agents}
    placed: dict[UUID, str | None] = {}

    def resolve(agent: Placement, depth: int = 0) -> str | None:
        if agent.id in placed:
            return placed[agent.id]
        if agent.broker is not None:
            result: str | None = agent.broker if agent.broker in names else None
        elif agent.master_id is None or agent.master_id not in by_id or depth > len(agents):
            result = roots[0] if len(roots) == 1 else None
        else:
            result = resolve(by_id[agent.master_id], depth + 1)
        placed[agent.id] = result
        return result

    for agent in agents:
        if agent.broker is not None and agent.broker not in names:
            problems.append(
                f"{where[agent.id]}: agent {agent.name!r}: broker {agent.broker!r} is not a "
                f"declared broker ({', '.join(sorted(names))})"
            )
        resolve(agent)
    root_broker = roots[0] if len(roots) == 1 else None
    for agent in agents:
        mine = placed[agent.id]
        if mine is None:
            continue
        master = by_id.get(agent.master_id) if agent.master_id is not None else None
        if agent.master_id is not None and master is None:
            continue
        theirs = root_broker if master is None else placed[master.id]
        if theirs is None:
            continue
        if theirs not in chain_up(brokers, mine):
            who = "the operator" if master is None else f"its master {master.name!r}"
            problems.append(
                f"{where[agent.id]}: agent {agent.name!r}: on broker {mine!r}, which {who} "
                f"(on broker {theirs!r}) cannot reach: bridges only run upstream, so put it "
                f"on {theirs!r} or a broker below it"
            )
    return placed
