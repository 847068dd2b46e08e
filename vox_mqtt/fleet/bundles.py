"""Render one agent's daemon config (or the operator's console config) from the fleet file."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vox_mqtt.broker.acl import EXPLORER_NAME, EXPLORER_PREFIX, explorer_id
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.manifest import load_manifest
from vox_mqtt.broker.passwd import Credentials, LookLogin, atomic_write, render_credentials
from vox_mqtt.broker.signkeys import ensure_keys, load_keys
from vox_mqtt.fleet.config import AgentSection, ConsoleFile, DaemonFile, OperatorSection
from vox_mqtt.fleet.explorer import ExplorerFile
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet
from vox_mqtt.protocol.settings import AgentConfig, BrokerSettings
from vox_mqtt.protocol.storm import reconnect_cap, reconnect_spread

__all__ = [
    "DEFAULT_STATE_ROOT",
    "RenderedConfig",
    "fleet_agent_config",
    "fleet_operator_config",
    "render_agent_config",
]

# Where the unit's StateDirectory=vox/%i puts each agent's ledger and epoch.
DEFAULT_STATE_ROOT = Path("/var/lib/vox")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, kw_only=True)
class RenderedConfig:
    """The files one render wrote: the config and the secrets it points at."""

    config: Path
    kind: str  # "agent", "operator" or "explorer"
    name: str
    secrets: tuple[Path, ...]


def render_agent_config(
    fleet: Fleet | str | Path,
    name: str,
    broker_dir: str | Path,
    out: str | Path,
    state_dir: str | Path | None = None,
    *,
    keepalive: int = 30,
    shutdown_grace: float = 10.0,
) -> RenderedConfig:
    """Write the daemon config of agent `name` (or the operator's or explorer's config)."""
    if not isinstance(fleet, Fleet):
        fleet = load_fleet(fleet)
    out = Path(out)
    kind, identity, ident_id = _identity(fleet, name)
    store = CredentialStore(broker_dir)
    source = store.path
    if not store.has(identity):
        raise ConfigError(
            [f"{source}: no credentials for {identity!r}: run `vox broker render` for this fleet"]
        )
    creds = store.get(identity)
    if creds.username != str(ident_id):
        raise ConfigError(
            [f"{source}: the credentials are for {creds.username}, not {identity} ({ident_id})"]
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError([f"--out {out}: cannot create its folder: {exc.strerror}"]) from None
    secrets, broker = _copy_secrets(creds, out, identity, keepalive)
    signing = _write_keys(fleet, kind, ident_id, identity, broker_dir, out.parent)
    if signing is not None:
        secrets = (*secrets, out.parent / signing["keys_file"])
    if kind == "operator":
        state = Path(state_dir) if state_dir is not None else Path(f"{identity}-state")
        text = _operator_text(fleet, state, broker) + _signing_text(signing)
        _check(text, ConsoleFile, out)
    elif kind == "explorer":
        text = _explorer_text(fleet, identity, ident_id, broker) + _signing_text(signing)
        _check(text, ExplorerFile, out)
    else:
        state = Path(state_dir) if state_dir is not None else DEFAULT_STATE_ROOT / identity
        broker.update(reconnect_settings(fleet, fleet.agent(identity).broker))
        text = _agent_text(fleet, ident_id, state, broker, shutdown_grace) + _signing_text(signing)
        _check(text, DaemonFile, out)
    atomic_write(out, text, mode=0o640)
    return RenderedConfig(config=out, kind=kind, name=identity, secrets=secrets)


def reconnect_settings(fleet: Fleet, broker: str | None) -> dict[str, float]:
    """Return the [broker] reconnect values of an agent on `broker`, sized to its agents.

    Every agent of a broker loses it at once when it restarts: their first tries spread
    over agents / CONNECTS_PER_SECOND seconds (protocol/storm.py, docs/federation.md).
    """
    spread = reconnect_spread(fleet.count_on(broker))
    return {"reconnect_min": round(spread, 3), "reconnect_max": reconnect_cap(spread)}


def _write_keys(
    fleet: Fleet, kind: str, ident_id: Any, identity: str, broker_dir: str | Path, folder: Path
) -> dict[str, Any] | None:
    """Write the identity's keys file; return its [signing] table (None: signatures off).

    It holds the identity's own private key and the public keys of its master and children
    only (the root's master is the operator), so no host learns the rest of the fleet's keys.
    """
    if fleet.signatures == "off":
        return None
    home = _keys_home(Path(broker_dir))
    ensure_keys(home, fleet)
    if home != Path(broker_dir):  # a site broker: one key per identity across the fleet
        ensure_keys(broker_dir, fleet, upstream=home)
    keys = load_keys(broker_dir)
    if kind != "agent" or ident_id == fleet.root.id:
        # The operator's machine holds every key already; its looks and the explorer check
        # every status and war-room post they show. The root reads the whole war room, so it
        # checks every agent's posts: it gets every public key (never a private one).
        peers = [(fleet.operator_id, fleet.operator_name), *((a.id, a.name) for a in fleet)]
    else:
        view = fleet.view_of(ident_id)
        peers = [(ident_id, identity), (view.master_id, view.master_name)]
        peers += [(child.id, child.name) for child in view.children]
    lines = [
        f"# vox-mqtt signing keys of {identity!r}: its own private key and the public keys of",
        "# its master and children only (docs/security.md). Keep it 0600 on its host.",
    ]
    if kind != "explorer":  # the explorer only reads: it has no key of its own
        lines.append(f"key = {_value(keys.current[ident_id].seed.hex())}")
    assert keys.seal is not None
    if kind == "explorer":
        pass
    elif kind == "operator":
        lines.append(f"seal_key = {_value(keys.seal.private.hex())}")
    else:
        lines.append(f"seal_to = {_value(keys.seal.public.hex())}  # the operator's: notes")
    agents = {a.id for a in fleet}
    for peer, name in peers:
        lines += ["", f"[peers.{_key(str(peer))}]", f"name = {_value(name)}"]
        if peer in agents and _knows_master(fleet, kind, ident_id, peer):
            # A view shows an agent under this master, whatever its status claims (F26).
            lines.append(f"master = {_value(str(fleet.master_of(peer)))}")
        lines += [
            f"keys = {_value([keys.current[peer].public.hex()])}",
            f"retired = {_value([old.hex() for old in keys.retired.get(peer, [])])}",
        ]
    name = f"{identity}.signing.toml"
    atomic_write(folder / name, "\n".join(lines) + "\n", mode=0o600)
    return {"mode": fleet.signatures, "keys_file": name, "replay_window": fleet.replay_window}


def _knows_master(fleet: Fleet, kind: str, ident_id: Any, peer: Any) -> bool:
    """Tell whether a bundle may name a peer's master: the operator's and the explorer's
    every one; an agent's (the root's too) its own and its children's only, so no host
    learns more of the tree than its conversations (docs/broker.md, ignorance)."""
    if kind != "agent":
        return True
    return bool(peer == ident_id or fleet.master_of(peer) == ident_id)


def _keys_home(broker_dir: Path) -> Path:
    """Return the broker directory whose keys are the fleet's: the top of its upstream chain."""
    seen: set[Path] = set()
    here = broker_dir
    while here.absolute() not in seen:
        seen.add(here.absolute())
        manifest = load_manifest(here.absolute())
        upstream = None if manifest is None else manifest.options.upstream_dir
        if not upstream:
            return here
        here = Path(upstream)
    return here


def _signing_text(signing: dict[str, Any] | None) -> str:
    if signing is None:
        return ""
    return "\n".join(["", "[signing]  # docs/security.md", *_assignments(signing)]) + "\n"


def _identity(fleet: Fleet, name: str) -> tuple[str, str, Any]:
    """Return (kind, name, id) of the agent or operator `name` designates."""
    try:
        agent = fleet.agent(name)
    except KeyError:
        if name in ("operator", fleet.operator_name, str(fleet.operator_id)):
            return "operator", fleet.operator_name, fleet.operator_id
        if name == EXPLORER_NAME or name.startswith(EXPLORER_PREFIX):
            # Each explorer has its own login (`vox broker render --explorer NAME`).
            return "explorer", name, explorer_id(fleet, name)
        known = ", ".join(sorted(a.name for a in fleet))
        raise ConfigError(
            [f"no agent {name!r} in the fleet (agents: {known}; or `operator`, `explorer`)"]
        ) from None
    return "agent", agent.name, agent.id


def _copy_secrets(
    creds: Credentials, out: Path, identity: str, keepalive: int
) -> tuple[tuple[Path, ...], dict[str, Any]]:
    """Copy the credentials (and TLS files) next to out; return them and the [broker] table."""
    folder = out.parent
    broker: dict[str, Any] = {
        "host": creds.host,
        "port": creds.port,
        "username": creds.username,
        "password_file": f"{identity}.credentials.toml",
        "keepalive": keepalive,
    }
    written: list[Path] = []
    local = creds
    if creds.tls:
        tls_dir = folder / f"{identity}.tls"
        tls_dir.mkdir(mode=0o700, exist_ok=True)
        files = {"ca_file": creds.ca_file, "cert_file": creds.cert_file, "key_file": creds.key_file}
        names = {"ca_file": "ca.crt", "cert_file": "client.crt", "key_file": "client.key"}
        for key, path in files.items():
            assert path is not None
            target = tls_dir / names[key]
            try:
                atomic_write(target, path.read_bytes(), mode=0o600)
            except OSError as exc:
                raise ConfigError([f"{path}: cannot copy the TLS file: {exc.strerror}"]) from None
            # Relative to the config file, as config.py resolves them: the folder can move.
            broker[key] = f"{identity}.tls/{names[key]}"
            written.append(target)
        local = replace(
            creds,
            ca_file=Path(broker["ca_file"]),
            cert_file=Path(broker["cert_file"]),
            key_file=Path(broker["key_file"]),
            looks=tuple(_copy_look(look, tls_dir, identity, written) for look in creds.looks),
        )
    secret = folder / broker["password_file"]
    lock = (
        "MQTT client id = username: the broker enforces it (use_username_as_clientid)."
        if creds.client_id_locked
        else "MQTT client id should be the username; this broker does NOT enforce it "
        "(rendered with --no-lock-client-ids): another identity can take over this session."
    )
    header = [
        f"vox-mqtt broker credentials of {identity!r}: keep them 0600 on its host only.",
        lock,
    ]
    atomic_write(secret, render_credentials(local, comment_lines=header), mode=0o600)
    return (secret, *written), broker


def _copy_look(look: LookLogin, tls_dir: Path, identity: str, written: list[Path]) -> LookLogin:
    """Copy one look's certificate and key beside the operator's; return it pointing there."""
    if look.cert_file is None or look.key_file is None:
        return look
    paths = {}
    for suffix, path in (("crt", look.cert_file), ("key", look.key_file)):
        target = tls_dir / f"{look.purpose}.{suffix}"
        try:
            atomic_write(target, path.read_bytes(), mode=0o600)
        except OSError as exc:
            raise ConfigError([f"{path}: cannot copy the TLS file: {exc.strerror}"]) from None
        written.append(target)
        paths[suffix] = Path(f"{identity}.tls/{target.name}")
    return replace(look, cert_file=paths["crt"], key_file=paths["key"])


def _agent_section(fleet: Fleet, agent_id: Any, state: Path, grace: float) -> dict[str, Any]:
    """Return the [agent] table of one agent's daemon config (children apart)."""
    view = fleet.view_of(agent_id)
    agent = view.agent
    heartbeat = agent.heartbeat_interval if agent.heartbeat_interval is not None else 15.0
    return {
        "name": agent.name,
        "id": str(agent.id),
        "master_id": str(view.master_id),
        "master_name": view.master_name,
        "roles": list(agent.roles),
        "state_dir": str(state),
        "heartbeat_interval": float(heartbeat),
        "stale_after": 3.0,
        "request_timeout": 30.0,
        "max_concurrency": 32,
        "shutdown_grace": float(grace),
        "disk_alert_percent": 95.0,
        "memory_alert_percent": 95.0,
        # The broker lets only the root read the war room.
        "watch_warroom": agent.id == fleet.root.id,
    }


def _operator_section(fleet: Fleet, state: Path) -> dict[str, Any]:
    """Return the [operator] table of the console's config."""
    return {
        "name": fleet.operator_name,
        "id": str(fleet.operator_id),
        "root_id": str(fleet.root.id),
        "root_name": fleet.root.name,
        "state_dir": str(state),
    }


def fleet_agent_config(
    fleet: Fleet, name: str, *, broker: BrokerSettings, state_dir: Path, **overrides: Any
) -> AgentConfig:
    """Return the AgentConfig a rendered daemon config of `name` would load, in memory."""
    agent = fleet.agent(name)
    section = _agent_section(fleet, agent.id, state_dir, 10.0)
    section["children"] = {str(c.id): c.name for c in fleet.view_of(agent.id).children}
    config = AgentSection.model_validate(section).agent_config(broker, base=Path.cwd())
    return replace(config, **overrides)


def fleet_operator_config(
    fleet: Fleet,
    *,
    broker: BrokerSettings,
    state_dir: Path,
    observe: Sequence[str] = (),
    **overrides: Any,
) -> AgentConfig:
    """Return the AgentConfig the operator's rendered console config would load, in memory."""
    section = OperatorSection.model_validate(_operator_section(fleet, state_dir))
    return replace(section.agent_config(broker, base=Path.cwd(), observe=observe), **overrides)


def _agent_text(
    fleet: Fleet, agent_id: Any, state: Path, broker: dict[str, Any], grace: float
) -> str:
    view = fleet.view_of(agent_id)
    agent = view.agent
    section = _agent_section(fleet, agent_id, state, grace)
    lines = [
        f"# vox-agent config of {agent.name!r}, rendered by `vox agent render` from the fleet",
        "# file. It names only this agent, its master and its direct children.",
        'kind = "agent"',
        "",
        "[agent]",
        *_assignments(section),
        "",
        "[agent.children]  # id = name",
        *(f"{_key(str(c.id))} = {_value(c.name)}" for c in view.children),
        "",
        "[agent.settings]  # handed to every role",
        *_assignments(dict(agent.settings)),
        "",
        "[broker]",
        *_assignments(broker),
    ]
    return "\n".join(lines) + "\n"


def _operator_text(fleet: Fleet, state: Path, broker: dict[str, Any]) -> str:
    section = _operator_section(fleet, state)
    lines = [
        "# vox console config of the operator, rendered by `vox agent render FLEET operator`.",
        'kind = "operator"',
        "",
        "[operator]",
        *_assignments(section),
        "",
        "[broker]",
        *_assignments(broker),
    ]
    return "\n".join(lines) + "\n"


def _explorer_text(fleet: Fleet, name: str, ident_id: Any, broker: dict[str, Any]) -> str:
    section = {
        "name": name,  # `explorer`, or a named one's `explorer-NAME`
        "id": str(ident_id),
        "operator_id": str(fleet.operator_id),
        "operator_name": fleet.operator_name,
    }
    lines = [
        f"# vox config of the read-only explorer, rendered by `vox agent render FLEET {name}`",
        "# (the broker lets it read vox/# and write nothing): for vox status and vox exporter.",
        'kind = "explorer"',
        "",
        "[explorer]",
        *_assignments(section),
        "",
        "[broker]",
        *_assignments(broker),
    ]
    return "\n".join(lines) + "\n"


def _check(
    text: str, model: type[DaemonFile] | type[ConsoleFile] | type[ExplorerFile], out: Path
) -> None:
    """Refuse to write a config its reader would reject (e.g. a bad role or name)."""
    try:
        model.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ConfigError([f"{out}: the rendered config does not validate: {exc}"]) from None


# --- a small TOML writer: the settings tables of a fleet file can hold any TOML value ----------


def _assignments(table: dict[str, Any]) -> list[str]:
    return [f"{_key(key)} = {_value(value)}" for key, value in table.items()]


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # A JSON string is a TOML basic string once DEL is escaped too.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError([f"cannot write {value!r} ({type(value).__name__}) into a TOML config"])
