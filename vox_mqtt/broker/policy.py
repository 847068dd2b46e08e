"""The fleet's policy as probes, and the proof that broker rules hold it (docs/broker.md).

`vox broker render` writes `policy.json` beside the rules: for every identity a bounded
set of probes drawn from what the fleet file implies, each a (user, topic, read or write,
allowed?) pair: one instance of each of its own rules (allowed), and topics of another
identity's rules it may not use plus the canary's forbidden topic (refused). Before a
reload installs anything (acl or dynsec, hand edit or not), `policy_problems` evaluates
the rules about to be installed against every probe, as Mosquitto decides them: the
`acl_file` first match in the user's block then the `pattern` lines; dynsec by role
priority, then `defaultACLAccess`. A rule set that would refuse an allowed path or open
a forbidden one is refused before the broker is touched; the canary then proves, after
the reload, that the broker loaded the rules that were proven.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

from vox_mqtt.broker.acl import (
    Identity,
    canary_forbidden_topic,
    sub_topic_problem,
    topic_matches,
)
from vox_mqtt.broker.aclcheck import _C_SPACE, _CONTROL, AclEntry, AclFile
from vox_mqtt.broker.passwd import atomic_write
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError, TopicError

__all__ = [
    "MAX_PROBES_PER_IDENTITY",
    "POLICY_NAME",
    "Probe",
    "acl_allows",
    "acl_answers",
    "dynsec_allows",
    "dynsec_answers",
    "load_policy",
    "policy_probes",
    "policy_problems",
    "policy_text",
    "rendered_acl_problems",
    "write_policy",
]

POLICY_NAME: Final = "policy.json"
MAX_PROBES_PER_IDENTITY: Final = 16
_MAX_ALLOWED: Final = 12  # instances of its own rules; the rest: forbidden paths
_NEIGHBOURS: Final = 4  # identities looked at for forbidden paths: bounded work per identity
_SAMPLE: Final = "probe"  # what fills a `+` or `#` level in a probe's topic
# dynsec's own defaults when defaultACLAccess does not say (mosquitto's dynamic-security).
_DYNSEC_DEFAULTS: Final = {
    "publishClientSend": False,
    "publishClientReceive": True,
    "subscribe": False,
    "unsubscribe": True,
}


class Probe(NamedTuple):
    """One path of one identity, and whether the fleet's policy allows it.

    A named tuple, not a frozen dataclass: a render of 10,000 agents makes 160,000 of
    them, and a frozen dataclass's field-by-field __init__ was a tenth of the probes'
    cost (docs/performance.md, figure 7).
    """

    user: str
    name: str
    topic: str
    write: bool
    allowed: bool

    def text(self) -> str:
        op = "write" if self.write else "read"
        verdict = "allowed" if self.allowed else "forbidden"
        return f"{self.name} ({self.user}) {op} {self.topic} must be {verdict}"


def _instance(filter_: str) -> str:
    if "+" not in filter_ and "#" not in filter_:
        return filter_  # a topic already: most rules name one
    return "/".join(_SAMPLE if level in ("+", "#") else level for level in filter_.split("/"))


class _Grants:
    """One identity's rules indexed for the probes: its exact topics in a set, per access.

    Same answers as Identity.may_read / may_write (a wildcard-free filter matches only
    its own text), without walking every rule per probe: the probes asked that about
    80,000 times for 10,000 agents (docs/performance.md, figure 7).
    """

    __slots__ = ("exact", "wild")

    def __init__(self, identity: Identity) -> None:
        self.exact: tuple[set[str], set[str]] = (set(), set())
        # A wildcard filter with the text before its first wildcard level: a topic it
        # matches starts with that text ("a/b/#" matches "a/b" itself, hence no "/").
        self.wild: tuple[list[tuple[str, str]], list[tuple[str, str]]] = ([], [])
        for rule in identity.rules:
            topic = rule.topic
            if "+" not in topic and "#" not in topic:
                if rule.read:
                    self.exact[False].add(topic)
                if rule.write:
                    self.exact[True].add(topic)
                continue
            cut = len(topic)
            for char in "+#":
                if char in topic:
                    cut = min(cut, topic.index(char))
            head = topic[: max(cut - 1, 0)]
            if rule.read:
                self.wild[False].append((head, topic))
            if rule.write:
                self.wild[True].append((head, topic))

    def may(self, topic: str, write: bool) -> bool:
        if topic in self.exact[write]:
            return True
        for head, filter_ in self.wild[write]:
            if topic.startswith(head) and topic_matches(filter_, topic):
                return True
        return False


def _paths(identity: Identity) -> list[tuple[str, bool]]:
    """Return an instance of each of its rules' paths, (topic, write), in the rules' order."""
    paths: list[tuple[str, bool]] = []
    for rule in identity.rules:
        topic = rule.topic
        if "+" in topic or "#" in topic:
            topic = _instance(topic)
        if rule.read:
            paths.append((topic, False))
        if rule.write:
            paths.append((topic, True))
    return paths


def _status_of_presence(topic: str, known: dict[str, str | None]) -> str | None:
    """Return the full status topic of a presence topic, None if it is not one (memoized)."""
    if topic not in known:
        known[topic] = None
        with contextlib.suppress(TopicError):
            parsed = topics.parse_topic(topic)
            if isinstance(parsed, topics.StatusTopic) and parsed.presence:
                known[topic] = topics.status(parsed.agent)
    return known[topic]


def _presence_only(grants: _Grants, identity: Identity, known: dict[str, str | None]) -> str | None:
    """Return the full status of the first one whose presence alone it reads (its master's).

    Ignorance enforced: a child reads its master's presence, never its status, which
    names the master's own master and its other children's commands (docs/broker.md).
    """
    for rule in identity.rules:
        if not (rule.read and rule.topic.endswith("/presence")):
            continue  # no presence read: parsing all 100,000 rules cost a third of a render
        # Each presence topic is read by its agent, its master and its children: parsed once.
        status = _status_of_presence(rule.topic, known)
        if status is not None and not grants.may(status, False):
            return status  # one such probe per identity is enough
    return None


def policy_probes(identities: Sequence[Identity]) -> tuple[Probe, ...]:
    """Return at most MAX_PROBES_PER_IDENTITY probes per identity (a pure function).

    Per identity: an instance of each of its first rules (allowed by construction: rules
    only grant), the canary's forbidden topic, the full status of one whose presence alone
    it reads, and the first path of each of the next identities in the fleet's order that
    it may not use (bounded work per identity). Each identity's paths are made once: its
    own probes and its predecessors' look at them (docs/performance.md, figure 7).
    """
    probes: list[Probe] = []
    forbidden_topic = canary_forbidden_topic()
    # Every identity's username is a UUID's canonical text: its presence topic's status
    # is known without parsing the topic (the others are parsed, once each).
    known: dict[str, str | None] = {
        topics.presence(i.username): topics.status(i.username) for i in identities
    }
    count = len(identities)
    paths = [_paths(identity) for identity in identities]
    steps = range(1, min(_NEIGHBOURS, count - 1) + 1)
    for index, identity in enumerate(identities):
        user, name = identity.username, identity.name  # a username is a UUID's text: made once
        grants = _Grants(identity)
        may = grants.may
        own = paths[index][:_MAX_ALLOWED]
        probes += [Probe(user, name, topic, write, True) for topic, write in own]
        # The canary's topic counts against the bound even in the (unusual) case it is allowed.
        allowed_canary = may(forbidden_topic, True)
        taken = len(own) + 1
        if not allowed_canary:
            probes.append(Probe(user, name, forbidden_topic, True, False))
        status = _presence_only(grants, identity, known)
        if status is not None:
            taken += 1
            probes.append(Probe(user, name, status, False, False))
        # Another identity's paths (the next ones in the fleet's order) it may not use:
        # one per neighbour, so the work per identity stays bounded.
        for step in steps:
            if taken >= MAX_PROBES_PER_IDENTITY:
                break
            for topic, write in paths[(index + step) % count]:
                if not may(topic, write):
                    probes.append(Probe(user, name, topic, write, False))
                    taken += 1
                    break
    return tuple(probes)


def rendered_acl_problems(identities: Iterable[Identity], *, source: str = "acl") -> list[str]:
    """Return why Mosquitto would not read render_acl_file's text as these rules, one line each.

    The renderer writes only `# KIND NAME`, `user UUID` and `topic ACCESS FILTER` lines,
    the access a fixed word and the username a UUID's text: the names and the filters are
    the only data in them. So instead of parsing 120,000 lines it wrote itself (a third of
    a render of 10,000 agents: docs/performance.md, figure 7), this asks of each of those
    what parse_acl_file would refuse or warn about: a control character (a newline in a
    name or filter would start a line of its own), spaces Mosquitto trims, an empty
    filter, a wildcard that is not a whole level. A hand-edited file still gets the
    full parse on reload.
    """
    problems: list[str] = []
    seen: set[str] = set()
    for identity in identities:
        # isprintable() first: a C call, and a control character is never printable.
        if not identity.name.isprintable() and _CONTROL.search(identity.name):
            problems.append(f"{source}: name {identity.name!r} contains control characters")
        for rule in identity.rules:
            topic = rule.topic
            if topic in seen:
                continue
            seen.add(topic)
            if not (rule.read or rule.write):
                problems.append(f"{source}: rule on {topic!r} grants nothing")
            if (
                not topic
                or topic != topic.strip(_C_SPACE)
                or (not topic.isprintable() and _CONTROL.search(topic))
            ):
                problems.append(f"{source}: topic {topic!r} has spaces or control characters")
                continue
            reason = sub_topic_problem(topic)
            if reason is not None:
                problems.append(f"{source}: invalid topic {topic!r}: {reason}")
    return problems


# The tail of a policy.json row per (write, allowed): `"w",true]` and the like.
_ROW_TAILS: Final = {
    (write, allowed): f"{json.dumps('w' if write else 'r')},{json.dumps(allowed)}]"
    for write in (False, True)
    for allowed in (False, True)
}


def policy_text(probes: Iterable[Probe]) -> str:
    """Return policy.json's text: json.dumps of the rows, compact, written row by row.

    The same bytes as `json.dumps({"version": 1, "probes": rows}, separators=(",", ":"))`
    (tests/unit/test_broker_policy.py), without 160,000 lists for the encoder to walk:
    each identity's user and name are encoded once (docs/performance.md, figure 7).
    """
    encode = json.encoder.encode_basestring_ascii  # json.dumps' own, with ensure_ascii
    rows: list[str] = []
    last: tuple[str, str] | None = None
    head = ""
    for user, name, topic, write, allowed in probes:
        if last != (user, name):
            last = (user, name)
            head = f"[{encode(user)},{encode(name)},"
        rows.append(f"{head}{encode(topic)},{_ROW_TAILS[bool(write), bool(allowed)]}")
    return '{"version":1,"probes":[' + ",".join(rows) + "]}"


def write_policy(root: Path, probes: Iterable[Probe]) -> None:
    """Write policy.json (0644: topics and ids, no secret)."""
    atomic_write(root / POLICY_NAME, policy_text(probes) + "\n", mode=0o644)


def load_policy(root: Path) -> tuple[Probe, ...] | None:
    """Return the probes render wrote, None for a directory rendered before them."""
    path = root / POLICY_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: unreadable ({exc}): re-render the broker"]) from None
    try:
        return tuple(
            Probe(user=str(u), name=str(n), topic=str(t), write=op == "w", allowed=bool(a))
            for u, n, t, op, a in data["probes"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError([f"{path}: not a policy this version reads ({exc})"]) from None


def acl_allows(acl: AclFile, username: str, topic: str, write: bool) -> bool:
    """Return what Mosquitto's acl_file check answers (first match: user block, patterns)."""
    return acl_answers(acl)(username, topic, write)


def acl_answers(acl: AclFile) -> Callable[[str, str, bool], bool]:
    """Return acl_allows for one file, its entries indexed by user once."""
    by_user: dict[str | None, list[AclEntry]] = {}
    patterns = [e for e in acl.entries if e.pattern]
    for entry in acl.entries:
        if not entry.pattern:
            by_user.setdefault(entry.user, []).append(entry)

    def allows(username: str, topic: str, write: bool) -> bool:
        for entry in (*by_user.get(username, ()), *patterns):
            filter_ = entry.topic
            if entry.pattern:
                filter_ = filter_.replace("%u", username).replace("%c", username)
            if not topic_matches(filter_, topic):
                continue
            if entry.deny:
                return False
            if entry.write if write else entry.read:
                return True
        return False

    return allows


def _dynsec_check(
    acls: list[Mapping[str, Any]], acltype: str, topic: str, defaults: Mapping[str, Any]
) -> bool:
    for acl in acls:
        if acl.get("acltype") != acltype and not (
            acltype == "subscribe"
            and acl.get("acltype") in ("subscribePattern", "subscribeLiteral")
        ):
            continue
        filter_ = str(acl.get("topic", ""))
        literal = acl.get("acltype") == "subscribeLiteral"
        if (filter_ == topic) if literal else topic_matches(filter_, topic):
            return bool(acl.get("allow", False))
    return bool(defaults.get(acltype, _DYNSEC_DEFAULTS[acltype]))


def dynsec_allows(document: Mapping[str, Any], username: str, topic: str, write: bool) -> bool:
    """Return what the dynamic-security plugin answers for a client of this document."""
    return dynsec_answers(document)(username, topic, write)


def dynsec_answers(document: Mapping[str, Any]) -> Callable[[str, str, bool], bool]:
    """Return dynsec_allows for one document, its clients' ACLs ordered once."""
    roles = {
        str(role.get("rolename")): role
        for role in document.get("roles", [])
        if isinstance(role, Mapping)
    }
    defaults = document.get("defaultACLAccess") or {}
    ordered: dict[str, list[Mapping[str, Any]]] = {}
    for client in document.get("clients", []):
        if not isinstance(client, Mapping) or client.get("disabled"):
            continue
        acls: list[tuple[int, int, Mapping[str, Any]]] = []
        for order, link in enumerate(client.get("roles", [])):
            role = roles.get(str(link.get("rolename"))) if isinstance(link, Mapping) else None
            for acl in [] if role is None else role.get("acls", []):
                if isinstance(acl, Mapping):
                    acls.append((-int(acl.get("priority", 0)), order, acl))
        ranked = sorted(acls, key=lambda item: (item[0], item[1]))
        ordered[str(client.get("username"))] = [acl for _, _, acl in ranked]

    def allows(username: str, topic: str, write: bool) -> bool:
        if username not in ordered:
            return False
        acls = ordered[username]
        if write:
            return _dynsec_check(acls, "publishClientSend", topic, defaults)
        return _dynsec_check(acls, "subscribe", topic, defaults) and _dynsec_check(
            acls, "publishClientReceive", topic, defaults
        )

    return allows


def policy_problems(
    probes: Iterable[Probe], allows: Any, *, limit: int = 3
) -> tuple[int, list[str]]:
    """Return how many probes the rules answer wrongly, and the first few, one line each.

    `allows(username, topic, write)` is the rules' answer (acl_allows / dynsec_allows bound
    to the rules about to be installed).
    """
    wrong = 0
    lines: list[str] = []
    for probe in probes:
        if bool(allows(probe.user, probe.topic, probe.write)) != probe.allowed:
            wrong += 1
            if len(lines) < limit:
                lines.append(probe.text())
    return wrong, lines
