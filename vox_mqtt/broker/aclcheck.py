"""What Mosquitto 2.0 accepts of an acl_file or a dynsec.json, checked before it loads one.

A file Mosquitto cannot parse on SIGHUP turns every ACL check off, so the parser here
accepts exactly what Mosquitto 2.0 accepts and reports lines that parse but are likely
mistakes; the dynsec checker refuses an open default access (docs/broker.md). The rules
themselves are rendered in broker/acl.py.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from vox_mqtt.broker.acl import sub_topic_problem
from vox_mqtt.broker.passwd import PasswordHash, decode_hash
from vox_mqtt.protocol.errors import ConfigError

__all__ = ["AclEntry", "AclFile", "check_dynsec", "dynsec_hashes", "parse_acl_file"]

# Whitespace as C's isspace() sees it in the "C" locale, which Mosquitto uses.
_C_SPACE: Final = " \t\n\v\f\r"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_DYNSEC_CLOSED: Final = ("publishClientSend", "publishClientReceive", "subscribe")
_ACCESS: Final = {"read": (True, False), "write": (False, True), "readwrite": (True, True)}
_DYNSEC_ACLTYPES: Final = frozenset(
    {
        "publishClientSend",
        "publishClientReceive",
        "subscribeLiteral",
        "subscribePattern",
        "unsubscribeLiteral",
        "unsubscribePattern",
    }
)


@dataclass(frozen=True, kw_only=True)
class AclEntry:
    """One `topic` or `pattern` line of an acl_file."""

    line: int
    user: str | None
    pattern: bool
    read: bool
    write: bool
    deny: bool
    topic: str


@dataclass(frozen=True, kw_only=True)
class AclFile:
    """An acl_file as Mosquitto loads it, plus lines that parse but are likely mistakes."""

    entries: tuple[AclEntry, ...]
    warnings: tuple[str, ...] = ()
    users: frozenset[str] = field(default_factory=frozenset)

    def rules_of(self, username: str) -> list[AclEntry]:
        """Return the `topic` entries of one user's block."""
        return [e for e in self.entries if not e.pattern and e.user == username]


def _token(text: str, pos: int) -> tuple[str | None, int]:
    """Return the next space-delimited token from pos, as strtok_r(..., " ") does."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text):
        return None, pos
    end = text.find(" ", pos)
    if end == -1:
        return text[pos:], len(text)
    return text[pos:end], end + 1


def _rest(text: str, pos: int) -> str | None:
    """Return the rest of the line, as strtok_r(..., "") does, trimmed like Mosquitto."""
    if pos >= len(text):
        return None
    return text[pos:].strip(_C_SPACE)


def parse_acl_file(text: str, *, source: str = "acl") -> AclFile:
    """Parse acl_file text with Mosquitto 2.0's rules; raise ConfigError naming each bad line."""
    problems: list[str] = []
    warnings: list[str] = []
    entries: list[AclEntry] = []
    users: set[str] = set()
    user: str | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        where = f"{source}:{number}"
        # fgets + strlen: a NUL ends the line early; then trailing whitespace goes.
        line = raw.split("\0", 1)[0].rstrip(_C_SPACE)
        if line.startswith("#"):
            continue
        keyword, pos = _token(line, 0)
        if keyword is None:
            continue
        if keyword == "user":
            name = _rest(line, pos)
            if not name:
                problems.append(f"{where}: `user` without a username")
                continue
            user = name
            users.add(name)
            continue
        if keyword not in ("topic", "pattern"):
            shown = line.replace("\t", "<TAB>")
            hint = " (tabs are not separators: use single spaces)" if "\t" in line else ""
            problems.append(f"{where}: not a `user`, `topic` or `pattern` line: {shown!r}{hint}")
            continue
        access, pos = _token(line, pos)
        if access is None:
            problems.append(f"{where}: `{keyword}` without a topic")
            continue
        topic = _rest(line, pos)
        if topic is None:
            topic, access = access, None
            if topic in _ACCESS or topic == "deny":
                warnings.append(
                    f"{where}: `{keyword} {topic}` grants readwrite on a topic named {topic!r}"
                )
        elif access not in _ACCESS and access != "deny":
            shown = access.replace("\t", "<TAB>")
            problems.append(
                f"{where}: access must be read, write, readwrite or deny, not {shown!r}"
            )
            continue
        reason = sub_topic_problem(topic)
        if reason is not None:
            problems.append(f"{where}: invalid topic {topic!r}: {reason}")
            continue
        if _CONTROL.search(topic):
            warnings.append(f"{where}: topic {topic!r} contains control characters or tabs")
        if keyword == "pattern" and "%c" not in topic and "%u" not in topic:
            warnings.append(f"{where}: pattern {topic!r} has neither %c nor %u")
        if keyword == "topic" and user is None:
            warnings.append(f"{where}: rule before any `user` line applies to anonymous clients")
        read, write = _ACCESS.get(access or "readwrite", (False, False))
        entries.append(
            AclEntry(
                line=number,
                user=None if keyword == "pattern" else user,
                pattern=keyword == "pattern",
                read=read,
                write=write,
                deny=access == "deny",
                topic=topic,
            )
        )
    if problems:
        raise ConfigError(problems)
    return AclFile(entries=tuple(entries), warnings=tuple(warnings), users=frozenset(users))


def _b64_len(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return None


def _check_dynsec_client(
    client: Any, where: str, role_names: set[str], problems: list[str]
) -> str | None:
    if not isinstance(client, dict) or not isinstance(client.get("username"), str):
        problems.append(f"{where}: a client needs a string `username`")
        return None
    username: str = client["username"]
    where = f"{where}: client {username!r}"
    if _b64_len(client.get("salt")) != 12 or _b64_len(client.get("password")) != 64:
        problems.append(f"{where}: password and salt must be base64 of 64 and 12 bytes")
    iterations = client.get("iterations")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        problems.append(f"{where}: iterations must be a positive integer")
    for role in client.get("roles", []):
        name = role.get("rolename") if isinstance(role, dict) else None
        if name not in role_names:
            problems.append(f"{where}: unknown role {name!r}")
    return username


def _check_dynsec_role(role: Any, where: str, problems: list[str]) -> str | None:
    if not isinstance(role, dict) or not isinstance(role.get("rolename"), str):
        problems.append(f"{where}: a role needs a string `rolename`")
        return None
    name: str = role["rolename"]
    for acl in role.get("acls", []):
        if not isinstance(acl, dict) or acl.get("acltype") not in _DYNSEC_ACLTYPES:
            problems.append(f"{where}: role {name!r}: unknown acltype in {acl!r}")
            continue
        topic = acl.get("topic")
        reason = "not a string" if not isinstance(topic, str) else sub_topic_problem(topic)
        if reason is not None or not isinstance(acl.get("allow"), bool):
            problems.append(f"{where}: role {name!r}: bad acl {acl!r} ({reason or 'allow'})")
    return name


def dynsec_hashes(text: str) -> dict[str, PasswordHash]:
    """Return username -> password hash of the clients of a dynsec.json (empty if unreadable)."""
    hashes: dict[str, PasswordHash] = {}
    try:
        for client in json.loads(text).get("clients", []):
            pw = decode_hash(
                salt_b64=client["salt"],
                digest_b64=client["password"],
                iterations=int(client["iterations"]),
            )
            if pw is not None:
                hashes[client["username"]] = pw
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    return hashes


def check_dynsec(text: str, *, source: str = "dynsec.json") -> None:
    """Check dynsec.json against the schema the plugin loads; raise ConfigError if it is off."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{source}: not valid JSON: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: the top level must be an object"])
    problems: list[str] = []
    defaults = data.get("defaultACLAccess")
    if not isinstance(defaults, dict) or not all(isinstance(v, bool) for v in defaults.values()):
        problems.append(f"{source}: defaultACLAccess must map access types to true/false")
    else:
        # Not given, publishClientReceive defaults to allowed in the plugin.
        opened = [k for k in _DYNSEC_CLOSED if defaults.get(k) is not False]
        if opened:
            problems.append(
                f"{source}: defaultACLAccess must set {', '.join(opened)} to false: otherwise "
                "every client may do what no role grants (the broker would be open)"
            )
    sections = {key: data.get(key, []) for key in ("clients", "roles", "groups")}
    for key, value in sections.items():
        if not isinstance(value, list):
            problems.append(f"{source}: `{key}` must be a list")
            sections[key] = []
    role_names: set[str] = set()
    for role in sections["roles"]:
        name = _check_dynsec_role(role, source, problems)
        if name is not None and name in role_names:
            problems.append(f"{source}: role {name!r} is defined twice")
        role_names.add(name or "")
    usernames: set[str] = set()
    for client in sections["clients"]:
        username = _check_dynsec_client(client, source, role_names, problems)
        if username is not None and username in usernames:
            problems.append(f"{source}: client {username!r} is defined twice")
        usernames.add(username or "")
    if problems:
        raise ConfigError(problems)
