"""The fleet file (TOML) as a validated tree: who is whose master, and what each may know."""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final
from uuid import UUID, uuid4

from vox_mqtt.protocol.errors import FleetError
from vox_mqtt.protocol.signing import REPLAY_WINDOW
from vox_mqtt.protocol.sites import BrokerSpec, Placement, broker_lines, parse_brokers, place_agents
from vox_mqtt.protocol.topics import WARROOM_ID

__all__ = [
    "MAX_CHILDREN",
    "AgentSpec",
    "AgentView",
    "Fleet",
    "load_fleet",
    "looks_like_id",
    "parse_fleet",
    "seed_fleet_toml",
]

# The most children one master may have. A master subscribes to each child's status
# (`vox/<uuid>/status`, 50 bytes of a SUBSCRIBE each): 1,000 of them take 50 KB, well
# within the broker's max_packet_size (docs/broker.md), with room for its other filters.
MAX_CHILDREN: Final = 1000
# A replay window longer than a day keeps a captured message usable for too long.
MAX_REPLAY_WINDOW: Final = 86400.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_AGENT_KEYS = frozenset(
    {"name", "id", "master_id", "roles", "settings", "heartbeat_interval", "broker"}
)
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_OPERATOR_KEYS = frozenset({"name", "id"})
# Ids no identity may take: the marker of an unreadable master_id, and the war room's.
_UNREADABLE = UUID(int=0)
_RESERVED = {_UNREADABLE: "the nil UUID", WARROOM_ID: "the war room's id"}
_UUID_FORM = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# A name the CLI could take for an id or an id prefix (4+ hex digits, hyphens aside).
_ID_LIKE = re.compile(r"[0-9a-fA-F-]*")
_ID_LIKE_DIGITS = 4


def looks_like_id(name: str) -> bool:
    """Return whether a name reads as a UUID or the start of one (4+ hex digits, hyphens)."""
    digits = name.replace("-", "")
    return bool(_ID_LIKE.fullmatch(name)) and len(digits) >= _ID_LIKE_DIGITS


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """One agent of the fleet as the file declares it."""

    name: str
    id: UUID
    master_id: UUID | None
    roles: tuple[str, ...] = ()
    # Left out of the hash: a read-only mapping is not hashable, the spec still is.
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    heartbeat_interval: float | None = None
    line: int = 0
    # The broker it lives on (docs/federation.md); None in a fleet without [[brokers]].
    broker: str | None = None


@dataclass(frozen=True, kw_only=True)
class AgentView:
    """The slice of the tree one agent may know: itself, its master and its children."""

    agent: AgentSpec
    master_id: UUID
    master_name: str
    children: tuple[AgentSpec, ...]

    @property
    def children_ids(self) -> frozenset[UUID]:
        """Return the ids of the direct children."""
        return frozenset(child.id for child in self.children)


@dataclass(frozen=True)
class Fleet:
    """A validated tree of agents with one root, whose master is the operator."""

    operator_id: UUID
    operator_name: str
    agents: tuple[AgentSpec, ...]
    brokers: tuple[BrokerSpec, ...] = ()
    # Whether messages must be signed: "require", "accept" or "off" (docs/security.md).
    signatures: str = "off"
    # Seconds a signed message may be taken after its emission, and re-sent (docs/security.md).
    replay_window: float = REPLAY_WINDOW
    _by_id: dict[UUID, AgentSpec] = field(init=False, repr=False, compare=False)
    _by_name: dict[str, AgentSpec] = field(init=False, repr=False, compare=False)
    _children: dict[UUID, tuple[AgentSpec, ...]] = field(init=False, repr=False, compare=False)
    _roots: tuple[AgentSpec, ...] = field(init=False, repr=False, compare=False)
    _on_broker: Counter[str | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {agent.id: agent for agent in self.agents}
        children: dict[UUID, list[AgentSpec]] = {agent.id: [] for agent in self.agents}
        for agent in self.agents:
            if agent.master_id is not None:
                children[agent.master_id].append(agent)
        # Asked per agent when 10,000 bundles or rules are rendered: found once here.
        roots = tuple(agent for agent in self.agents if agent.master_id is None)
        object.__setattr__(self, "_roots", roots[:1])
        object.__setattr__(self, "_on_broker", Counter(agent.broker for agent in self.agents))
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_by_name", {agent.name: agent for agent in self.agents})
        object.__setattr__(
            self, "_children", {key: tuple(value) for key, value in children.items()}
        )

    @property
    def root(self) -> AgentSpec:
        """Return the one agent without a master."""
        return next(iter(self._roots))

    def count_on(self, broker: str | None) -> int:
        """Return how many agents live on a broker (None: of a fleet with one broker)."""
        return self._on_broker[broker]

    @property
    def root_broker(self) -> str | None:
        """Return the broker without an upstream (the operator's), or None for one broker."""
        return next((b.name for b in self.brokers if b.upstream is None), None)

    def __iter__(self) -> Iterator[AgentSpec]:
        return iter(self.agents)

    def __len__(self) -> int:
        return len(self.agents)

    def agent(self, key: str | UUID) -> AgentSpec:
        """Return the agent with this name or id; raise KeyError if there is none."""
        if isinstance(key, UUID):
            return self._by_id[key]
        # An exact id first: a name never shadows an id (the file refuses id-like names).
        parsed = _parse_uuid(key)
        if parsed is not None and parsed in self._by_id:
            return self._by_id[parsed]
        if key in self._by_name:
            return self._by_name[key]
        raise KeyError(key)

    def master_of(self, agent_id: UUID) -> UUID:
        """Return the agent's master id; the root's master is the operator."""
        master = self.agent(agent_id).master_id
        return self.operator_id if master is None else master

    def children_of(self, agent_id: UUID) -> tuple[AgentSpec, ...]:
        """Return the direct children of an agent (the operator's child is the root)."""
        if agent_id == self.operator_id:
            return (self.root,)
        return self._children[self.agent(agent_id).id]

    def get_hierarchy_snapshot(self) -> dict[UUID, list[UUID]]:
        """Return the parent -> children graph, every agent a key."""
        return {agent.id: [c.id for c in self.children_of(agent.id)] for agent in self.agents}

    def depth_of(self, agent_id: UUID) -> int:
        """Return how many masters are above an agent (the root is 0)."""
        depth, current = 0, self.agent(agent_id)
        while current.master_id is not None:
            depth, current = depth + 1, self.agent(current.master_id)
        return depth

    def view_of(self, agent_id: UUID) -> AgentView:
        """Return what one agent may know of the tree."""
        agent = self.agent(agent_id)
        master_name = (
            self.operator_name if agent.master_id is None else self.agent(agent.master_id).name
        )
        return AgentView(
            agent=agent,
            master_id=self.master_of(agent.id),
            master_name=master_name,
            children=self.children_of(agent.id),
        )


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file; raise FleetError with one line per problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FleetError(
            [f"{path}: no such fleet file (create one with `vox init {path}`)"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError([f"{path}: cannot read the fleet file: {exc}"]) from None
    return parse_fleet(text, source=str(path))


def _agent_lines(text: str) -> list[int]:
    """Return the line number of each `[[agents]]` header, in order."""
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip().replace(" ", "").startswith("[[agents]]")
    ]


def _parse_uuid(value: Any) -> UUID | None:
    # Only the 8-4-4-4-12 form, as in messages; UUID() alone also takes braces and urn:.
    if not isinstance(value, str) or not _UUID_FORM.fullmatch(value):
        return None
    return UUID(value)


def parse_fleet(text: str, *, source: str = "fleet.toml") -> Fleet:
    """Validate fleet-file text; raise FleetError naming each offending agent and line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FleetError([f"{source}: not valid TOML: {exc}"]) from None
    problems: list[str] = []
    unknown_top = sorted(
        set(data) - {"operator", "agents", "brokers", "signatures", "replay_window"}
    )
    if unknown_top:
        problems.append(f"{source}: unknown section(s) {', '.join(unknown_top)}")
    # Absent: "off", as every fleet file before signatures; `vox init` writes "require".
    signatures = data.get("signatures", "off")
    if signatures not in ("require", "accept", "off"):
        problems.append(
            f'{source}: signatures = {signatures!r}: must be "require", "accept" or "off"'
        )
    replay_window = data.get("replay_window", REPLAY_WINDOW)
    if (
        isinstance(replay_window, bool)
        or not isinstance(replay_window, int | float)
        or not 0 < replay_window <= MAX_REPLAY_WINDOW
    ):
        problems.append(
            f"{source}: replay_window = {replay_window!r}: must be seconds,"
            f" over 0 and at most {MAX_REPLAY_WINDOW:g}"
        )
        replay_window = REPLAY_WINDOW

    operator = data.get("operator")
    operator_id: UUID | None = None
    operator_name = "operator"
    if not isinstance(operator, dict):
        problems.append(f"{source}: missing [operator] section with the console's id")
    else:
        for key in sorted(set(operator) - _OPERATOR_KEYS):
            problems.append(f"{source}: [operator]: unknown key {key!r}")
        operator_id = _parse_uuid(operator.get("id"))
        if operator_id is None:
            problems.append(f"{source}: [operator] id {operator.get('id')!r} is not a UUID")
        elif operator_id in _RESERVED:
            reserved = _RESERVED[operator_id]
            problems.append(f"{source}: [operator] id {operator_id} is reserved ({reserved})")
        name = operator.get("name", "operator")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(f"{source}: [operator] name {name!r} is not a valid name")
        elif looks_like_id(name):
            problems.append(f"{source}: [operator] name {name!r} reads as an id (4+ hex digits)")
        else:
            operator_name = name

    raw_agents = data.get("agents")
    if not isinstance(raw_agents, list) or not raw_agents:
        problems.append(f"{source}: no [[agents]] declared")
        raise FleetError(problems)

    lines = _agent_lines(text)
    specs: list[AgentSpec] = []
    for index, raw in enumerate(raw_agents):
        line = lines[index] if index < len(lines) else 0
        spec = _parse_agent(raw, index, line, source, problems)
        if spec is not None:
            specs.append(spec)
    _check_tree(specs, operator_id, source, problems)
    brokers = parse_brokers(data.get("brokers"), broker_lines(text), source, problems)
    placement = place_agents(
        [
            Placement(name=s.name, id=s.id, master_id=s.master_id, broker=s.broker, line=s.line)
            for s in specs
        ],
        brokers,
        source,
        problems,
    )
    if problems or operator_id is None:
        raise FleetError(problems)
    specs = [replace(spec, broker=placement[spec.id]) for spec in specs]
    return Fleet(
        operator_id, operator_name, tuple(specs), brokers, str(signatures), float(replay_window)
    )


def _parse_agent(
    raw: Any, index: int, line: int, source: str, problems: list[str]
) -> AgentSpec | None:
    where = f"{source}:{line}" if line else source
    if not isinstance(raw, dict):
        problems.append(f"{where}: agent #{index + 1} is not a table")
        return None
    name = raw.get("name")
    label = f"agent {name!r}" if isinstance(name, str) else f"agent #{index + 1}"
    for key in sorted(set(raw) - _AGENT_KEYS):
        problems.append(f"{where}: {label}: unknown key {key!r}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(
            f"{where}: {label}: name must be letters, digits, '.', '_' or '-' (got {name!r})"
        )
    elif looks_like_id(name):
        problems.append(
            f"{where}: {label}: the name reads as an id (a UUID or 4+ hex digits), which "
            f"`vox` commands take for one: add a letter beyond a-f (e.g. 'node-{name}')"
        )
    agent_id = _parse_uuid(raw.get("id"))
    if agent_id is None:
        problems.append(f"{where}: {label}: id {raw.get('id')!r} is not a UUID")
    elif agent_id in _RESERVED:
        problems.append(f"{where}: {label}: id {agent_id} is reserved ({_RESERVED[agent_id]})")
    master_raw = raw.get("master_id", "")
    master_id = None if master_raw == "" else _parse_uuid(master_raw)
    if master_raw != "" and master_id is None:
        problems.append(f"{where}: {label}: master_id {master_raw!r} is not a UUID")
        # Not a root either: keep it out of the root count and the tree checks.
        master_id = _UNREADABLE
    roles = raw.get("roles", [])
    if not isinstance(roles, list) or not all(
        isinstance(r, str) and _ROLE.fullmatch(r) for r in roles
    ):
        problems.append(f"{where}: {label}: roles must be a list of 'module:Class' (got {roles!r})")
        roles = []
    settings = raw.get("settings", {})
    if not isinstance(settings, dict):
        problems.append(f"{where}: {label}: settings must be a table")
        settings = {}
    interval = raw.get("heartbeat_interval")
    if interval is not None and (
        isinstance(interval, bool)
        or not isinstance(interval, int | float)
        or not math.isfinite(interval)
        or interval <= 0
    ):
        problems.append(f"{where}: {label}: heartbeat_interval must be a positive number")
        interval = None
    broker = raw.get("broker")
    if broker is not None and not isinstance(broker, str):
        problems.append(f"{where}: {label}: broker must name a [[brokers]] entry")
        broker = None
    # An agent with other problems still takes part in the tree checks, so that its
    # children are not also reported as having an unknown master.
    if agent_id is None or not isinstance(name, str):
        return None
    return AgentSpec(
        name=name,
        id=agent_id,
        master_id=master_id,
        roles=tuple(roles),
        settings=MappingProxyType(dict(settings)),
        heartbeat_interval=None if interval is None else float(interval),
        line=line,
        broker=broker,
    )


def _check_tree(
    specs: list[AgentSpec], operator_id: UUID | None, source: str, problems: list[str]
) -> None:
    def where(spec: AgentSpec) -> str:
        return f"{source}:{spec.line}" if spec.line else source

    def at(spec: AgentSpec) -> str:
        return f"{spec.name!r} (line {spec.line})" if spec.line else repr(spec.name)

    seen_ids: dict[UUID, AgentSpec] = {}
    seen_names: dict[str, AgentSpec] = {}
    for spec in specs:
        if spec.id in seen_ids:
            problems.append(
                f"{where(spec)}: agent {spec.name!r}: id {spec.id} is already used by "
                f"{at(seen_ids[spec.id])}"
            )
        if spec.name in seen_names:
            problems.append(
                f"{where(spec)}: agent {spec.name!r}: the name is already used by "
                f"{at(seen_names[spec.name])}"
            )
        if spec.id == operator_id:
            problems.append(f"{where(spec)}: agent {spec.name!r}: id is the operator's id")
        seen_ids.setdefault(spec.id, spec)
        seen_names.setdefault(spec.name, spec)

    children: dict[UUID, int] = {}
    for spec in specs:
        if spec.master_id is not None:
            children[spec.master_id] = children.get(spec.master_id, 0) + 1
    for master, count in children.items():
        if count > MAX_CHILDREN and master in seen_ids:
            problems.append(
                f"{where(seen_ids[master])}: agent {seen_ids[master].name!r}: {count} children, "
                f"more than the {MAX_CHILDREN} one master may have (docs/operations.md)"
            )

    roots = [spec for spec in specs if spec.master_id is None]
    if len(roots) > 1:
        names = ", ".join(at(spec) for spec in roots)
        problems.append(f"{source}: several roots ({names}): exactly one agent has no master_id")
    if not roots and specs:
        problems.append(f"{source}: no root: exactly one agent must have no master_id")
    for spec in specs:
        if spec.master_id is None or spec.master_id == _UNREADABLE:
            continue
        if spec.master_id == spec.id:
            problems.append(f"{where(spec)}: agent {spec.name!r}: is its own master")
        elif spec.master_id not in seen_ids:
            problems.append(
                f"{where(spec)}: agent {spec.name!r}: master_id {spec.master_id} "
                "is not a known agent"
            )
        else:
            cycle = _cycle_above(spec, seen_ids)
            if cycle:
                chain = " -> ".join(repr(agent.name) for agent in (*cycle, cycle[0]))
                relation = "is on" if spec in cycle else "hangs below"
                problems.append(
                    f"{where(spec)}: agent {spec.name!r}: {relation} the master cycle {chain} "
                    "and never reaches the root"
                )


def _cycle_above(spec: AgentSpec, by_id: dict[UUID, AgentSpec]) -> list[AgentSpec]:
    """Return the cycle met when following master_id up from spec, or [] if there is none."""
    path: list[AgentSpec] = []
    seen: set[UUID] = set()
    current: AgentSpec | None = spec
    while current is not None and current.id not in seen:
        # A self-master is reported on its own; the agents below it are not on a cycle.
        if current.master_id == current.id:
            return []
        path.append(current)
        seen.add(current.id)
        current = None if current.master_id is None else by_id.get(current.master_id)
    if current is None:
        return []
    return path[path.index(current) :]


def seed_fleet_toml() -> str:
    """Return the seed 000 example tree as fleet-file text, with fresh UUIDs."""
    operator, root, coordinator, spec_a, spec_b = (uuid4() for _ in range(5))
    return f"""\
# vox-mqtt fleet file: one [operator] and one [[agents]] table per agent.
# The agent without master_id is the root; its master is the operator.
# roles = ["module:Class"] are loaded by each agent's daemon.
# Every message is signed and verified; "accept" or "off" for a fleet that upgrades.
signatures = "require"

[operator]
name = "operator"
id = "{operator}"

[[agents]]
name = "root"
id = "{root}"
roles = ["examples.freelance:Root"]

[[agents]]
name = "coordinator"
id = "{coordinator}"
master_id = "{root}"
roles = ["examples.freelance:Coordinator"]

[[agents]]
name = "specialist_a"
id = "{spec_a}"
master_id = "{coordinator}"
roles = ["examples.freelance:Analyst", "examples.freelance:MailWatcher"]

[[agents]]
name = "specialist_b"
id = "{spec_b}"
master_id = "{coordinator}"
roles = ["examples.freelance:Analyst"]
"""
