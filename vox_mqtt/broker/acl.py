"""Broker security generated from the tree: who may read and write which VOX topic.

One rule set per identity (each agent, the operator and the optional explorer),
rendered either as a Mosquitto `acl_file` or as the dynamic-security plugin's
`dynsec.json`, plus a parser that accepts exactly what Mosquitto 2.0 accepts,
because a file Mosquitto cannot parse on SIGHUP turns every ACL check off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Final
from uuid import UUID, uuid5

from vox_mqtt.broker.passwd import PasswordHash
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import AgentSpec, Fleet

__all__ = [
    "ADMIN_NAME",
    "CANARY_NAME",
    "DYNSEC_CONTROL",
    "EXPLORER_NAME",
    "EXPLORER_PREFIX",
    "LOOK_PURPOSES",
    "Identity",
    "Kind",
    "Rule",
    "admin_identity",
    "canary_forbidden_topic",
    "canary_identity",
    "canary_topic",
    "explorer_id",
    "explorer_identity",
    "explorer_names",
    "fleet_identities",
    "look_name",
    "render_acl_file",
    "render_dynsec",
    "sub_topic_problem",
    "topic_matches",
]

EXPLORER_NAME: Final = "explorer"
# A named explorer's identity: `vox broker render --explorer alice` makes `explorer-alice`.
# Each person or tool reading the broker gets its own, so with client ids locked to
# usernames two explorers never kick each other off (docs/operations.md, "Attach an
# explorer").
EXPLORER_PREFIX: Final = "explorer-"
_EXPLORER_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Agent names start with a letter or digit, so no agent can ever be called this.
CANARY_NAME: Final = "_canary"
_EXPLORER_NS: Final = "vox-mqtt read-only explorer"
_CANARY_NS: Final = "vox-mqtt reload canary"
# The operator's read-only looks, one identity each: with client ids locked to
# usernames, `vox status` beside `vox watch` or the long-running `vox exporter` would
# otherwise kick one another (and the operator's own session, which holds its queued
# notifications).
LOOK_PURPOSES: Final = ("watch", "status", "exporter")
_LOOK_NS: Final = "vox-mqtt operator look"
ADMIN_NAME: Final = "_admin"
_ADMIN_NS: Final = "vox-mqtt dynamic-security admin"
DYNSEC_CONTROL: Final = "$CONTROL/dynamic-security/v1"
# topics.py builds per-agent topics; these two filters exist only for the broker.
_EVERYTHING: Final = f"{topics.PREFIX}/#"


class Kind(StrEnum):
    """What an identity is."""

    AGENT = "agent"
    OPERATOR = "operator"
    EXPLORER = "explorer"
    LOOK = "look"
    CANARY = "canary"
    ADMIN = "admin"
    BRIDGE = "bridge"  # a site broker's link upstream (docs/federation.md)


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Read and/or write access to one topic filter."""

    topic: str
    read: bool = False
    write: bool = False


@dataclass(frozen=True, kw_only=True)
class Identity:
    """One broker account: MQTT username = client id = the identity's UUID."""

    name: str
    id: UUID
    kind: Kind
    rules: tuple[Rule, ...]

    @cached_property
    def username(self) -> str:
        """Return the MQTT username (and client id): made once, a render asks 60,000 times."""
        return str(self.id)

    def may_read(self, topic: str) -> bool:
        """Return whether this identity receives messages published on topic."""
        return any(rule.read and topic_matches(rule.topic, topic) for rule in self.rules)

    def may_write(self, topic: str) -> bool:
        """Return whether this identity may publish on topic (wills and retained included)."""
        return any(rule.write and topic_matches(rule.topic, topic) for rule in self.rules)


def explorer_id(fleet: Fleet, name: str = EXPLORER_NAME) -> UUID:
    """Return an explorer's id: stable per fleet and name, so certificates and secrets survive.

    The unnamed explorer keeps the id it always had; a named one's id comes from its name.
    """
    if name == EXPLORER_NAME:
        return uuid5(fleet.operator_id, _EXPLORER_NS)
    return uuid5(fleet.operator_id, f"{_EXPLORER_NS} {name}")


def explorer_names(names: Iterable[str]) -> tuple[str, ...]:
    """Return the identity names of explorers given as NAME, `explorer-NAME` or `explorer`.

    `alice` and `explorer-alice` are the same explorer, so a name printed by one render
    can be given back to the next; `explorer` is the unnamed one. Sorted and without
    repeats: the order they were given in does not change the rendered files.
    """
    result: set[str] = set()
    problems: list[str] = []
    for given in names:
        bare = given.removeprefix(EXPLORER_PREFIX)
        if given == EXPLORER_NAME:
            result.add(EXPLORER_NAME)
        elif _EXPLORER_NAME_RE.fullmatch(bare) is None:
            problems.append(
                f"--explorer {given!r}: a name is 1 to 64 letters, digits, '-', '_' or '.', "
                "starting with a letter or digit"
            )
        else:
            result.add(EXPLORER_PREFIX + bare)
    if problems:
        raise ConfigError(problems)
    return tuple(sorted(result))


def explorer_identity(fleet: Fleet, name: str) -> Identity:
    """Return the read-only explorer `name` (an identity name): it reads vox/#, writes nothing."""
    return Identity(
        name=name,
        id=explorer_id(fleet, name),
        kind=Kind.EXPLORER,
        rules=(Rule(topic=_EVERYTHING, read=True),),
    )


def canary_topic(nonce: str) -> str:
    """Return the one topic the reload canary may publish on for this rendering."""
    return f"{topics.PREFIX}/canary/{nonce}"


def canary_forbidden_topic() -> str:
    """Return a topic no identity may publish on: the canary's publish there must fail."""
    return f"{topics.PREFIX}/canary/forbidden"


def canary_identity(fleet: Fleet, nonce: str) -> Identity:
    """Return the canary: it may publish only on its rendering's topic, and read nothing.

    `vox broker reload` logs in as it after SIGHUP: an allowed publish proves the new
    rules are loaded, a refused one proves an ACL is in force at all (docs/broker.md).
    """
    return Identity(
        name=CANARY_NAME,
        id=uuid5(fleet.operator_id, _CANARY_NS),
        kind=Kind.CANARY,
        rules=(Rule(topic=canary_topic(nonce), write=True),),
    )


def admin_identity(fleet: Fleet) -> Identity:
    """Return the dynamic-security admin: it alone may change the broker's rules live.

    Its credentials stay in the broker directory; it has no certificate, so with TLS it
    can log in only on the plain listener, which then listens on loopback only.
    """
    return Identity(
        name=ADMIN_NAME,
        id=uuid5(fleet.operator_id, _ADMIN_NS),
        kind=Kind.ADMIN,
        rules=(
            Rule(topic=DYNSEC_CONTROL, write=True),
            Rule(topic=f"{DYNSEC_CONTROL}/response", read=True),
        ),
    )


def _agent_rules(
    fleet: Fleet, agent: AgentSpec, root: UUID, text: dict[UUID, str]
) -> tuple[Rule, ...]:
    # Ids as text, made once per fleet: str(UUID) for every topic was a fifth of a render.
    me = text[agent.id]
    master = text[fleet.operator_id if agent.master_id is None else agent.master_id]
    children = [text[child.id] for child in fleet.children_of(agent.id)]
    rules = [
        Rule(topic=topics.inbox_filter(me), read=True),
        Rule(topic=topics.inbox(master, me), write=True),
        *(Rule(topic=topics.inbox(child, me), write=True) for child in children),
        # Written by the agent (its will on the presence); read back to resume its epoch.
        Rule(topic=topics.status(me), read=True, write=True),
        Rule(topic=topics.presence(me), read=True, write=True),
        # Of its master only the presence: the full status names the master's own master
        # and its other children's commands, which this agent must not learn (docs/broker.md).
        Rule(topic=topics.presence(master), read=True),
        *(Rule(topic=topics.status(child), read=True) for child in children),
        *(Rule(topic=topics.presence(child), read=True) for child in children),
        # Posts about itself and its own children only: a forged incident about the
        # root or another branch is refused at the broker (docs/broker.md).
        Rule(topic=topics.warroom(me, me), write=True),
        *(Rule(topic=topics.warroom(me, child), write=True) for child in children),
    ]
    if agent.id == root:
        rules.append(Rule(topic=topics.WARROOM_FILTER, read=True))
    return tuple(rules)


def _operator_rules(fleet: Fleet) -> tuple[Rule, ...]:
    operator = fleet.operator_id
    return (
        Rule(topic=topics.inbox_filter(operator), read=True),
        Rule(topic=topics.inbox(fleet.root.id, operator), write=True),
        Rule(topic=topics.STATUS_FILTER, read=True),
        Rule(topic=topics.PRESENCE_FILTER, read=True),
        Rule(topic=topics.WARROOM_FILTER, read=True),
    )


def look_name(purpose: str) -> str:
    """Return the identity name of one of the operator's looks (no agent can be called so)."""
    return f"_{purpose}"


def _looks(fleet: Fleet) -> list[Identity]:
    rules = (
        Rule(topic=topics.STATUS_FILTER, read=True),
        Rule(topic=topics.PRESENCE_FILTER, read=True),
        Rule(topic=topics.WARROOM_FILTER, read=True),
    )
    return [
        Identity(
            name=look_name(purpose),
            id=uuid5(fleet.operator_id, f"{_LOOK_NS} {purpose}"),
            kind=Kind.LOOK,
            rules=rules,
        )
        for purpose in LOOK_PURPOSES
    ]


def fleet_identities(
    fleet: Fleet, *, explorer: bool = False, explorers: Iterable[str] = ()
) -> tuple[Identity, ...]:
    """Return every broker identity of the fleet with its rules: operator, its looks, agents.

    Then the read-only explorers: the unnamed `explorer` with explorer=True, and one per
    name of `explorers` (NAME or `explorer-NAME`, see explorer_names).
    """
    wanted = explorer_names([*((EXPLORER_NAME,) if explorer else ()), *explorers])
    names = {agent.name for agent in fleet}
    clashes = [n for n in (fleet.operator_name, *wanted) if n in names]
    if clashes:
        raise ConfigError(
            [
                f"fleet: {n!r} names an agent and a broker identity; rename the agent"
                for n in clashes
            ]
        )
    result = [
        Identity(
            name=fleet.operator_name,
            id=fleet.operator_id,
            kind=Kind.OPERATOR,
            rules=_operator_rules(fleet),
        ),
        *_looks(fleet),
    ]
    text = {a.id: str(a.id) for a in fleet} | {fleet.operator_id: str(fleet.operator_id)}
    root = fleet.root.id  # once: finding it walks the agents
    result += [
        Identity(name=a.name, id=a.id, kind=Kind.AGENT, rules=_agent_rules(fleet, a, root, text))
        for a in fleet
    ]
    result += [explorer_identity(fleet, name) for name in wanted]
    return tuple(result)


def topic_matches(filter_: str, topic: str) -> bool:
    """Return whether a topic filter matches a topic, as Mosquitto decides it."""
    if "+" not in filter_ and "#" not in filter_:
        return filter_ == topic  # no wildcard: every level equal is the same text
    if filter_.startswith("$") != topic.startswith("$"):
        return False
    levels, parts = filter_.split("/"), topic.split("/")
    for index, level in enumerate(levels):
        if level == "#":
            return True
        if index >= len(parts) or (level != "+" and level != parts[index]):
            return False
    return len(levels) == len(parts)


def sub_topic_problem(topic: str) -> str | None:
    """Return why Mosquitto rejects a topic filter (mosquitto_sub_topic_check), or None."""
    if len(topic) > 16383 and len(topic.encode("utf-8", "surrogateescape")) > 65535:
        return "longer than 65535 bytes"
    if "+" not in topic and "#" not in topic:
        return None
    levels = topic.split("/")
    if all(level == "+" or ("+" not in level and "#" not in level) for level in levels[:-1]):
        last = levels[-1]
        if last in ("+", "#") or ("+" not in last and "#" not in last):
            return None  # every wildcard a whole level, '#' only last: the rules' own shape
    previous = ""
    for index, char in enumerate(topic):
        following = topic[index + 1] if index + 1 < len(topic) else ""
        if char == "+" and (previous not in ("", "/") or following not in ("", "/")):
            return "'+' must fill a whole topic level"
        if char == "#" and (previous not in ("", "/") or following != ""):
            return "'#' must be the whole last topic level"
        previous = char
    return None


# The access word per (read, write), looked up once per line of a 120,000-line file (a
# rule granting nothing is refused by rendered_acl_problems after the text is made).
_WORDS: Final = {(1, 1): "readwrite", (1, 0): "read", (0, 1): "write", (0, 0): "write"}


def render_acl_file(identities: Iterable[Identity], *, header: Iterable[str] = ()) -> str:
    """Return a Mosquitto acl_file: one `user` block of `topic` lines per identity."""
    out = [f"# {line}" for line in header]
    # No line before the first `user`: those would apply to anonymous clients.
    for identity in identities:
        out.append(f"# {identity.kind.value} {identity.name}")
        out.append(f"user {identity.username}")
        out.extend(f"topic {_WORDS[rule.read, rule.write]} {rule.topic}" for rule in identity.rules)
    return "\n".join(out) + "\n"


def _dynsec_acls(rule: Rule) -> list[dict[str, Any]]:
    acls: list[dict[str, Any]] = []
    if rule.read:
        # Subscribing and receiving are two separate checks in dynsec.
        acls.append({"acltype": "subscribePattern", "topic": rule.topic, "allow": True})
        acls.append({"acltype": "publishClientReceive", "topic": rule.topic, "allow": True})
    if rule.write:
        acls.append({"acltype": "publishClientSend", "topic": rule.topic, "allow": True})
    return acls


def role_name(identity: Identity) -> str:
    """Return the dynsec role that carries one identity's rules."""
    return f"vox-{identity.username}"


def render_dynsec(identities: Iterable[Identity], hashes: Mapping[UUID, PasswordHash]) -> str:
    """Return dynsec.json: deny by default, one client and one role per identity."""
    clients: list[dict[str, Any]] = []
    roles: list[dict[str, Any]] = []
    for identity in identities:
        pw = hashes[identity.id]
        clients.append(
            {
                "username": identity.username,
                "textName": f"{identity.kind.value} {identity.name}",
                "password": pw.digest_b64,
                "salt": pw.salt_b64,
                "iterations": pw.iterations,
                "roles": [{"rolename": role_name(identity)}],
            }
        )
        acls = [acl for rule in identity.rules for acl in _dynsec_acls(rule)]
        roles.append({"rolename": role_name(identity), "acls": acls})
    document = {
        # Receive defaults to allowed in dynsec; deny it so delivery is fenced too.
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": False,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": clients,
        "groups": [],
        "roles": roles,
    }
    return json.dumps(document, indent=1) + "\n"
