"""Render the fleet broker's directory (conf, ACL, passwd, credential store) and reload it safely.

Facts of Mosquitto 2.0.11 this module is built around (measured):
- it reads passwd and ACL after dropping privileges: they must belong to its `user`;
- an acl_file it cannot parse on SIGHUP leaves it running with no ACL at all, so
  nothing reaches the broker before parse_acl_file has accepted it;
- the dynamic-security plugin reads dynsec.json only at start (SIGHUP ignores it);
- a client id is only a claim unless `use_username_as_clientid` is set: without it one
  identity can take over another's persistent session. It is global in 2.0.11, so it
  is on by default and each concurrent connection needs its own identity: the
  operator's read-only looks get their own (docs/broker.md).
"""

from __future__ import annotations

import contextlib
import gc
import glob
import hashlib
import os
import pwd
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from uuid import UUID

from vox_mqtt.broker.acl import (
    EXPLORER_NAME,
    EXPLORER_PREFIX,
    Identity,
    Kind,
    admin_identity,
    canary_identity,
    explorer_names,
    fleet_identities,
    render_acl_file,
    render_dynsec,
)
from vox_mqtt.broker.aclcheck import check_dynsec, dynsec_hashes
from vox_mqtt.broker.credstore import CredentialStore, StoredIdentity
from vox_mqtt.broker.federation import broker_identities, site_section
from vox_mqtt.broker.hupguard import LOGROTATE_NAME, logrotate_text
from vox_mqtt.broker.lastgood import seed_last_good
from vox_mqtt.broker.manifest import (
    FleetRecord,
    Manifest,
    RenderOptions,
    file_digest,
    write_manifest,
)
from vox_mqtt.broker.passwd import (
    Credentials,
    Hashing,
    LookLogin,
    PasswordHash,
    atomic_write,
    new_secret,
    parse_passwd,
    render_passwd,
)
from vox_mqtt.broker.pki import PkiLayout
from vox_mqtt.broker.policy import policy_probes, rendered_acl_problems, write_policy
from vox_mqtt.broker.text import broker_file_text
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet
from vox_mqtt.protocol.messages import MAX_PACKET_BYTES

__all__ = [
    "DEFAULT_USER",
    "BrokerDir",
    "find_dynsec_plugin",
    "render_broker_dir",
]

Format = Literal["acl", "dynsec"]
DEFAULT_USER: Final = "mosquitto"
CONF_NAME: Final = "mosquitto.conf"
# The whole-packet cap is protocol/messages.MAX_PACKET_BYTES (message_size_limit is
# deprecated in 2.0 and answers with a PUBACK code a client may reject).
_PLUGIN_GLOBS: Final = (
    "/usr/lib/*/mosquitto_dynamic_security.so",
    "/usr/lib/mosquitto_dynamic_security.so",
    "/usr/local/lib/mosquitto_dynamic_security.so",
    "/usr/local/lib/*/mosquitto_dynamic_security.so",
)


@dataclass(frozen=True, kw_only=True)
class BrokerDir:
    """A rendered broker directory: what to start mosquitto with and how clients log in."""

    root: Path
    conf: Path
    fmt: Format
    acl: Path | None
    dynsec: Path | None
    passwd: Path | None
    # Names of the identities in the credential store (agents, the operator, the explorers).
    identities: tuple[str, ...]
    host: str
    port: int
    tls_port: int | None
    warnings: tuple[str, ...] = ()

    @property
    def store(self) -> CredentialStore:
        """Return the credential store of this directory (credentials/secrets.json)."""
        return CredentialStore(self.root)

    def credentials_for(self, key: str | UUID) -> Credentials:
        """Load the credentials of an identity given by name, UUID or UUID string."""
        return self.store.get(key)


def find_dynsec_plugin() -> Path:
    """Return the dynamic-security plugin's path; raise ConfigError saying how to get it."""
    for pattern in _PLUGIN_GLOBS:
        for match in sorted(glob.glob(pattern)):
            return Path(match)
    raise ConfigError(
        ["mosquitto_dynamic_security.so not found: install mosquitto >= 2.0 or use --format acl"]
    )


def _safe_text(value: str, what: str) -> str:
    # A newline in a path or host would inject directives into mosquitto.conf.
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value) or value != value.strip():
        raise ConfigError([f"{what} {value!r} must be non-empty, with no control characters"])
    return value


def _owner_of(user: str) -> tuple[tuple[int, int] | None, str | None]:
    """Return (uid, gid) to give broker files to, or a warning why they keep their owner."""
    if os.geteuid() != 0:
        if user == pwd.getpwuid(os.geteuid()).pw_name:
            return None, None
        return None, f"not root: give passwd, ACL, tls/ and data/ to `{user}` (broker/README.md)"
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None, f"user `{user}` does not exist here: chown the broker files on the broker host"
    return (entry.pw_uid, entry.pw_gid), None


def _existing_hashes(root: Path) -> dict[str, PasswordHash]:
    hashes: dict[str, PasswordHash] = {}
    with contextlib.suppress(OSError):
        hashes.update(dynsec_hashes((root / "dynsec.json").read_text(encoding="utf-8")))
    with contextlib.suppress(OSError):
        hashes.update(parse_passwd((root / "passwd").read_text("utf-8", errors="replace"))[0])
    return hashes


def queue_limits(agents: int) -> tuple[int, int]:
    """Return max_queued_messages and max_queued_bytes for a fleet of this many agents.

    One client may be owed every retained message of the fleet at once: a fresh look, or
    a master restarting under its children. Each agent has two retained liveness topics
    and at most two war-room posts (about itself, and its master's about it); the 1,000 on
    top are the room for live traffic the config always had. Mosquitto drops what does not
    fit, QoS 0 and QoS 1 alike (docs/broker.md). The bytes keep a client's queue within
    what 1,000 messages of 256 KiB could take. An agent puts at most `quiet_publishes`
    (500) non-answers into a silent peer's queue, and a few copies of each answer
    (agent/quietpeers.py): the 1,000 leave room for its answers (docs/security.md, F25).
    """
    messages = 1000 + 4 * agents
    return messages, max(256 * 2**20, 4096 * messages)


def render_conf(
    *,
    root: Path,
    fmt: Format,
    bind: str,
    port: int,
    tls_port: int | None,
    run_as_user: str,
    plugin: Path | None = None,
    lock_client_ids: bool = False,
    agents: int = 0,
) -> str:
    """Return mosquitto.conf for a rendered broker directory (its queues sized to agents)."""
    queued_messages, queued_bytes = queue_limits(agents)
    lines = [
        "# Generated by `vox broker render`: edit the fleet file and re-render, not this file.",
        "per_listener_settings false",
        "allow_anonymous false",
        f"user {run_as_user}",
    ]
    if fmt == "acl":
        lines += [f"password_file {root / 'passwd'}", f"acl_file {root / 'acl'}"]
    else:
        lines += [f"plugin {plugin}", f"plugin_opt_config_file {root / 'dynsec.json'}"]
    lines += [
        # Without it (and TCP_NODELAY on clients) a loopback round trip took 88 ms, not 1.5.
        "set_tcp_nodelay true",
        "persistence true",
        f"persistence_location {root / 'data'}/",
        "autosave_interval 60",
        "persistent_client_expiration 14d",
        "max_inflight_messages 20",
        f"max_queued_messages {queued_messages}",
        f"max_queued_bytes {queued_bytes}",
        f"max_packet_size {MAX_PACKET_BYTES}",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_type information",
        "connection_messages true",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        "",
    ]
    # With TLS, plain MQTT stays on loopback for tools on the broker host.
    plain_bind = "127.0.0.1" if tls_port is not None else bind
    lock = ["use_username_as_clientid true"] if lock_client_ids else []
    lines += [f"listener {port} {plain_bind}", *lock]
    if tls_port is not None:
        tls = root / "tls"
        lines += [
            "",
            f"listener {tls_port} {bind}",
            f"cafile {tls / 'ca.crt'}",
            f"certfile {tls / 'server.crt'}",
            f"keyfile {tls / 'server.key'}",
            "tls_version tlsv1.2",
            "require_certificate true",
            # The certificate's CN (the identity's UUID) is the username: a key is an identity.
            "use_identity_as_username true",
            *lock,
        ]
    return "\n".join(lines) + "\n"


def _check_args(fmt: str, host: str, bind: str, port: int, tls_port: int | None) -> None:
    problems: list[str] = []
    if fmt not in ("acl", "dynsec"):
        problems.append(f"--format must be acl or dynsec, not {fmt!r}")
    for what, value in (("--port", port), ("--tls-port", tls_port)):
        if value is not None and not 0 < value < 65536:
            problems.append(f"{what} must be from 1 to 65535 (got {value})")
    if tls_port is not None and tls_port == port:
        problems.append(f"--port and --tls-port must differ (both {port})")
    for what, text in (("--host", host), ("--bind", bind)):
        if not text or any(c.isspace() or ord(c) < 32 for c in text) or "#" in text:
            problems.append(f"{what} {text!r} must be a host name or address without spaces")
    if problems:
        raise ConfigError(problems)


def _prepare_dir(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "credentials").mkdir(exist_ok=True, mode=0o700)
        (root / "data").mkdir(exist_ok=True, mode=0o700)
        probe = root / f".vox-write-probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError([f"--out {root}: cannot write there: {reason}"]) from None


def _tls_files(pki_dir: Path, identities: tuple[Identity, ...]) -> dict[str, bytes]:
    layout = PkiLayout(pki_dir)
    missing = layout.missing(identity.id for identity in identities)
    if missing:
        shown = ", ".join(str(p) for p in missing[:3]) + (" ..." if len(missing) > 3 else "")
        flag = "".join(
            f" --explorer {i.name.removeprefix(EXPLORER_PREFIX)}"
            if i.name != EXPLORER_NAME
            else " --explorer"
            for i in identities
            if i.kind is Kind.EXPLORER
        )
        raise ConfigError(
            [
                f"--pki {pki_dir}: {len(missing)} file(s) missing ({shown}): "
                f"run `vox pki init {pki_dir} FLEET{flag}`"
            ]
        )
    return {
        "ca.crt": layout.ca_cert.read_bytes(),
        "server.crt": layout.server_cert.read_bytes(),
        "server.key": layout.server_key.read_bytes(),
    }


def _local_host(bind: str) -> str:
    """Return the address the broker host's own tools (canary, admin) connect to."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "*") else bind


def _secrets(
    root: Path, identities: Sequence[Identity], rotate: bool, rotate_names: Collection[str]
) -> tuple[dict[UUID, str], dict[UUID, PasswordHash | None]]:
    """Return each identity's password and the hash kept for it (None: hash it anew)."""
    unknown = sorted(set(rotate_names) - {i.name for i in identities})
    if unknown:
        raise ConfigError([f"--rotate {n}: no identity of that name in the fleet" for n in unknown])
    secrets = {} if rotate else CredentialStore(root).passwords()
    old_hashes = {} if rotate else _existing_hashes(root)
    passwords: dict[UUID, str] = {}
    kept: dict[UUID, PasswordHash | None] = {}
    for identity in identities:
        fresh = identity.name in rotate_names
        passwords[identity.id] = (None if fresh else secrets.get(identity.username)) or new_secret()
        kept[identity.id] = None if fresh else old_hashes.get(identity.username)
    return passwords, kept


def _render_security(
    fmt: Format,
    fleet: Fleet,
    identities: Sequence[Identity],
    hashed: Callable[[], Mapping[UUID, PasswordHash]],
) -> tuple[str, str, str, tuple[Identity, ...]]:
    """Return (file name, text, canary nonce, identities with the canary last)."""

    # The canary's topic names this rendering, so its allowed publish proves these
    # rules (not the previous ones) are in force; an unchanged fleet keeps the nonce.
    # The rules are rendered once: the canary's block goes after the others' (its
    # own rule cannot be part of what it names).
    header = [f"vox-mqtt acl_file for {len(identities) + 1} identities: generated, do not edit."]
    rules = render_acl_file(identities, header=header)
    digest = hashlib.sha256(rules.encode("utf-8"))
    if fmt == "dynsec":
        hashes = hashed()
        # dynsec.json also carries the hashes: a rotated secret is a new rendering too.
        digest.update(
            "".join(f"{i.username}:{hashes[i.id].passwd_field()}\n" for i in identities).encode()
        )
    nonce = digest.hexdigest()[:16]
    canary = canary_identity(fleet, nonce)
    every = (*identities, canary)
    if fmt == "acl":
        text = rules + render_acl_file((canary,))
        # The bytes as Mosquitto reads them (line length, control bytes, UTF-8) over the
        # whole file; the rules' data (names, filters) checked once each rather than the
        # 120,000 lines this code just wrote re-parsed (docs/performance.md, figure 7).
        broker_file_text(text.encode(), source="rendered acl")
        problems = rendered_acl_problems(every, source="rendered acl")
        if problems:
            raise ConfigError(problems)
        return "acl", text, nonce, every
    text = render_dynsec(every, hashed())
    check_dynsec(text, source="rendered dynsec.json")
    return "dynsec.json", text, nonce, every


def _identities_here(
    fleet: Fleet,
    root: Path,
    broker: str | None,
    upstream_dir: str | Path | None,
    *,
    explorers: tuple[str, ...],
    keepalive: int,
) -> tuple[tuple[Identity, ...], str, dict[str, bytes]]:
    """Return the identities of this broker, its bridge section and the bridge's TLS files."""
    if broker is None:
        if fleet.brokers:
            names = ", ".join(b.name for b in fleet.brokers)
            raise ConfigError(
                [f"the fleet has several brokers: choose one with --broker ({names})"]
            )
        return fleet_identities(fleet, explorers=explorers), "", {}
    # One broker of a federation (docs/federation.md): its own clients and bridges.
    upstream = None if upstream_dir is None else Path(upstream_dir).absolute()
    bridge_conf, bridge_tls = site_section(
        fleet, broker, upstream, root / "tls", keepalive=keepalive
    )
    return broker_identities(fleet, broker, explorers=explorers), bridge_conf, bridge_tls


def _write_bridge(
    root: Path, bridge_conf: str, *, mode: int, owner: tuple[int, int] | None
) -> Path | None:
    """Write bridge/bridge.conf (its secret stays out of mosquitto.conf); return its folder."""
    folder = root / "bridge"
    if not bridge_conf:
        (folder / "bridge.conf").unlink(missing_ok=True)
        return None
    folder.mkdir(exist_ok=True, mode=0o700)
    if owner is not None:
        os.chown(folder, *owner)
        os.chmod(folder, 0o750)
    atomic_write(folder / "bridge.conf", bridge_conf, mode=mode, owner=owner)
    return folder


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (as timeit does); resume it if it was on.

    A render of 10,000 agents makes about a million objects that live until it returns
    and form no cycle: the collector's passes walked every one of them again and again,
    a third of the render's CPU (docs/performance.md, figure 7).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@_collector_paused()
def render_broker_dir(
    fleet: Fleet,
    out_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 1883,
    fmt: Format = "acl",
    pki_dir: str | Path | None = None,
    rotate: bool = False,
    rotate_names: Collection[str] = (),
    explorer: bool = False,
    explorers: Sequence[str] = (),
    run_as_user: str | None = None,
    tls_port: int = 8883,
    bind: str | None = None,
    lock_client_ids: bool = True,
    broker: str | None = None,
    upstream_dir: str | Path | None = None,
    bridge_keepalive: int = 10,
) -> BrokerDir:
    """Write mosquitto.conf, the ACL, passwd, the credential store and render.json into out_dir.

    explorer adds the unnamed read-only explorer, explorers one per name (NAME or
    `explorer-NAME`): each person or tool reading the broker logs in as its own.
    """
    root = Path(out_dir).absolute()
    _safe_text(str(root), "--out")
    wanted = explorer_names([*((EXPLORER_NAME,) if explorer else ()), *explorers])
    options = RenderOptions(
        host=host,
        bind=bind,
        port=port,
        tls_port=tls_port,
        fmt=fmt,
        pki=None if pki_dir is None else str(Path(pki_dir).absolute()),
        explorers=wanted,
        user=run_as_user,
        lock_client_ids=lock_client_ids,
        broker=broker,
        upstream_dir=None if upstream_dir is None else str(Path(upstream_dir).absolute()),
        bridge_keepalive=bridge_keepalive,
    )
    bind = host if bind is None else bind
    with_tls = pki_dir is not None
    _check_args(fmt, host, bind, port, tls_port if with_tls else None)
    user = _safe_text(run_as_user or DEFAULT_USER, "--user")
    identities, bridge_conf, bridge_tls = _identities_here(
        fleet, root, broker, upstream_dir, explorers=wanted, keepalive=bridge_keepalive
    )
    plugin = find_dynsec_plugin() if fmt == "dynsec" else None
    tls = None
    if pki_dir is not None:
        pki_root = Path(pki_dir).absolute()
        _safe_text(str(pki_root), "--pki")
        tls = _tls_files(pki_root, identities)
    _prepare_dir(root)
    # The canary's id does not depend on its topic: its secret is settled with the rest.
    local = (canary_identity(fleet, ""),) + ((admin_identity(fleet),) if fmt == "dynsec" else ())
    passwords, kept = _secrets(root, (*identities, *local), rotate, rotate_names)
    # For a large fleet the hashing goes on in another interpreter while this thread
    # renders and probes the rules: for 10,000 identities the two take about as long
    # (passwd.Hashing; docs/performance.md, figure 7). A hash that still matches
    # its secret is kept, so an unchanged fleet renders unchanged files.
    with Hashing(passwords, kept) as hashing:
        security_name, security_text, nonce, every = _render_security(
            fmt, fleet, identities + local[1:], hashing.result
        )
        probes = policy_probes(every)
        hashes = hashing.result()

    owner, warning = _owner_of(user)
    # As root: the broker reads its files through their group, and root keeps owning
    # them, so `vox broker reload` works within the unit's capability bounds
    # (no CAP_DAC_OVERRIDE needed; docs/broker.md). Only data/ is the broker's own.
    readable = None if owner is None else (0, owner[1])
    mode = 0o600 if owner is None else 0o640
    warnings = [warning] if warning else []
    # What the running broker last loaded, kept before it is overwritten (docs/broker.md).
    seed_last_good(root)
    tls_files = {**(tls or {}), **bridge_tls}
    if tls_files:
        (root / "tls").mkdir(exist_ok=True, mode=0o700)
        if readable is not None:
            os.chown(root / "tls", *readable)
            os.chmod(root / "tls", 0o750)
        for name, data in tls_files.items():
            atomic_write(root / "tls" / name, data, mode=mode, owner=readable)
    bridge_dir = _write_bridge(root, bridge_conf, mode=mode, owner=readable)
    written: dict[str, bytes] = {security_name: security_text.encode("utf-8")}
    if fmt == "acl":
        written["passwd"] = render_passwd({i.username: hashes[i.id] for i in every}).encode()
    for name, data in written.items():
        atomic_write(root / name, data, mode=mode, owner=readable)
    # The other format's files would only mislead a reader (and `vox broker reload`).
    for other in ("dynsec.json",) if fmt == "acl" else ("acl", "passwd"):
        (root / other).unlink(missing_ok=True)
    if owner is not None:
        os.chown(root / "data", *owner)
    conf_text = render_conf(
        root=root,
        fmt=fmt,
        bind=bind,
        port=port,
        tls_port=tls_port if with_tls else None,
        run_as_user=user,
        plugin=plugin,
        lock_client_ids=lock_client_ids,
        agents=len(fleet.agents),
    )
    if bridge_dir is not None:
        conf_text += f"\ninclude_dir {bridge_dir}\n"
    atomic_write(root / CONF_NAME, conf_text, mode=0o644)
    written[CONF_NAME] = conf_text.encode("utf-8")
    if with_tls:
        # Rotation without SIGHUP, for /etc/logrotate.d/mosquitto (docs/security.md, F2).
        atomic_write(root / LOGROTATE_NAME, logrotate_text(), mode=0o644)
    else:
        (root / LOGROTATE_NAME).unlink(missing_ok=True)

    stored: list[StoredIdentity] = []
    layout = None if pki_dir is None else PkiLayout(Path(pki_dir).absolute())
    plain_host = _local_host("127.0.0.1" if with_tls else bind)
    looks = tuple(
        LookLogin(
            purpose=look.name.lstrip("_"),
            username=look.username,
            password=passwords[look.id],
            cert_file=None if layout is None else layout.client_cert(look.id),
            key_file=None if layout is None else layout.client_key(look.id),
        )
        for look in every
        if look.kind is Kind.LOOK
    )
    for identity in every:
        on_broker_host = identity.kind in (Kind.CANARY, Kind.ADMIN)
        tls_identity = layout is not None and not on_broker_host
        creds = Credentials(
            username=identity.username,
            password=passwords[identity.id],
            host=plain_host if on_broker_host else host,
            port=tls_port if tls_identity else port,
            ca_file=layout.ca_cert if tls_identity and layout else None,
            cert_file=layout.client_cert(identity.id) if tls_identity and layout else None,
            key_file=layout.client_key(identity.id) if tls_identity and layout else None,
            client_id_locked=lock_client_ids,
            looks=looks if identity.kind is Kind.OPERATOR else (),
        )
        stored.append(StoredIdentity(name=identity.name, id=identity.id, creds=creds))
    # One 0600 file, not one per identity (docs/broker.md); identities that left the
    # fleet are not in it, and per-identity files of an older render are migrated away.
    CredentialStore(root).write(stored)
    # The fleet's policy as probes: every reload proves the rules it installs hold it.
    write_policy(root, probes)
    digests = {name: file_digest(data) for name, data in written.items()}
    record = FleetRecord(
        operator_id=str(fleet.operator_id), agents={a.name: str(a.id) for a in fleet}
    )
    write_manifest(root, Manifest(options=options, files=digests, canary_nonce=nonce, fleet=record))
    return BrokerDir(
        root=root,
        conf=root / CONF_NAME,
        fmt=fmt,
        acl=root / "acl" if fmt == "acl" else None,
        dynsec=root / "dynsec.json" if fmt == "dynsec" else None,
        passwd=root / "passwd" if fmt == "acl" else None,
        identities=tuple(item.name for item in stored),
        host=host,
        port=port,
        tls_port=tls_port if with_tls else None,
        warnings=tuple(warnings),
    )
