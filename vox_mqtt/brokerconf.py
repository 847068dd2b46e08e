"""Render the fleet broker's directory (conf, ACL, passwd, credentials) and reload it safely.

Facts of Mosquitto 2.0.11 this module is built around (measured):
- it reads passwd and ACL after dropping privileges: they must belong to its `user`;
- an acl_file it cannot parse on SIGHUP leaves it running with no ACL at all, so
  nothing reaches the broker before parse_acl_file has accepted it;
- the dynamic-security plugin reads dynsec.json only at start (SIGHUP ignores it);
- a client id is only a claim: `use_username_as_clientid` stops one identity from
  taking over another's persistent session, but it is global in 2.0.11 and makes every
  second connection of an identity (the operator's `vox status` beside `vox watch`, a
  root's-eye `vox status`) kick the first; so it is opt-in (`lock_client_ids`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import signal
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from uuid import UUID

from .acl import (
    Identity,
    check_dynsec,
    dynsec_hashes,
    fleet_identities,
    parse_acl_file,
    render_acl_file,
    render_dynsec,
)
from .errors import BrokerUnavailable, ConfigError
from .federation import broker_identities, site_section
from .hierarchy import Fleet
from .messages import MAX_MESSAGE_BYTES
from .passwd import (
    Credentials,
    PasswordHash,
    atomic_write,
    atomic_write_many,
    hash_passwords,
    load_credentials,
    load_secrets,
    new_secret,
    parse_passwd,
    render_credentials,
    render_passwd,
)
from .pki import PkiLayout

__all__ = [
    "DEFAULT_USER",
    "BrokerDir",
    "ReloadReport",
    "find_dynsec_plugin",
    "reload_broker",
    "render_broker_dir",
]

Format = Literal["acl", "dynsec"]
DEFAULT_USER: Final = "mosquitto"
CONF_NAME: Final = "mosquitto.conf"
# Whole-packet cap: a VOX payload of MAX_MESSAGE_BYTES plus topic and v5 properties.
# (message_size_limit is deprecated in 2.0 and answers with a PUBACK code paho rejects.)
MAX_PACKET_BYTES: Final = MAX_MESSAGE_BYTES + 16 * 1024
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
    # Keyed by identity name (agents, the operator's name, "explorer") and by UUID.
    credentials: Mapping[str | UUID, Path]
    host: str
    port: int
    tls_port: int | None
    warnings: tuple[str, ...] = ()

    def credentials_for(self, key: str | UUID) -> Credentials:
        """Load the credentials of an identity given by name, UUID or UUID string."""
        if key not in self.credentials and isinstance(key, str):
            with contextlib.suppress(ValueError):
                key = UUID(key)
        return load_credentials(self.credentials[key])


@dataclass(frozen=True, kw_only=True)
class ReloadReport:
    """What reload_broker checked and signalled."""

    acl: Path
    rules: int
    replaced: bool
    warnings: tuple[str, ...]


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
) -> str:
    """Return mosquitto.conf for a rendered broker directory."""
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
        "max_queued_messages 1000",
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
        flag = " --explorer" if any(i.kind.value == "explorer" for i in identities) else ""
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


def _credential_header(identity: Identity) -> list[str]:
    return [
        f"vox-mqtt broker credentials of {identity.kind.value} {identity.name!r}.",
        "Secret: keep it 0600 and on the host that runs this identity only.",
        "MQTT client id = username (the broker enforces it).",
    ]


def _write_credentials(
    identities: tuple[Identity, ...],
    passwords: Mapping[UUID, str],
    cred_dir: Path,
    address: Credentials,
    layout: PkiLayout | None,
) -> dict[str | UUID, Path]:
    """Write one credentials file per identity and drop those of identities that left."""
    credentials: dict[str | UUID, Path] = {}
    files: list[tuple[Path, str]] = []
    for identity in identities:
        creds = Credentials(
            username=identity.username,
            password=passwords[identity.id],
            host=address.host,
            port=address.port,
            ca_file=None if layout is None else layout.ca_cert,
            cert_file=None if layout is None else layout.client_cert(identity.id),
            key_file=None if layout is None else layout.client_key(identity.id),
        )
        path = cred_dir / f"{identity.name}.toml"
        files.append((path, render_credentials(creds, comment_lines=_credential_header(identity))))
        credentials[identity.name] = path
        credentials[identity.id] = path
    atomic_write_many(files, mode=0o600)
    # Secrets of identities that left the fleet must not linger.
    current = {p.name for p in credentials.values()}
    for stale in cred_dir.glob("*.toml"):
        if stale.name not in current:
            stale.unlink()
    return credentials


def render_broker_dir(
    fleet: Fleet,
    out_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 1883,
    fmt: Format = "acl",
    pki_dir: str | Path | None = None,
    rotate: bool = False,
    explorer: bool = False,
    run_as_user: str | None = None,
    tls_port: int = 8883,
    bind: str | None = None,
    lock_client_ids: bool = False,
    broker: str | None = None,
    upstream_dir: str | Path | None = None,
    bridge_keepalive: int = 10,
) -> BrokerDir:
    """Write mosquitto.conf, the ACL, passwd and a credentials file per identity into out_dir."""
    root = Path(out_dir).absolute()
    _safe_text(str(root), "--out")
    bind = host if bind is None else bind
    with_tls = pki_dir is not None
    _check_args(fmt, host, bind, port, tls_port if with_tls else None)
    user = _safe_text(run_as_user or DEFAULT_USER, "--user")
    if fleet.brokers and broker is None:
        names = ", ".join(b.name for b in fleet.brokers)
        raise ConfigError([f"the fleet has several brokers: choose one with --broker ({names})"])
    if broker is not None:
        # One broker of a federation (docs/federation.md): its own clients and bridges.
        identities = broker_identities(fleet, broker, explorer=explorer)
        bridge_conf, bridge_tls = site_section(
            fleet,
            broker,
            None if upstream_dir is None else Path(upstream_dir).absolute(),
            root / "tls",
            keepalive=bridge_keepalive,
        )
    else:
        identities = fleet_identities(fleet, explorer=explorer)
        bridge_conf, bridge_tls = "", {}
    plugin = find_dynsec_plugin() if fmt == "dynsec" else None
    tls = None
    if pki_dir is not None:
        pki_root = Path(pki_dir).absolute()
        _safe_text(str(pki_root), "--pki")
        tls = _tls_files(pki_root, identities)
    _prepare_dir(root)
    cred_dir = root / "credentials"

    secrets = {} if rotate else load_secrets(cred_dir)
    old_hashes = {} if rotate else _existing_hashes(root)
    passwords = {i.id: secrets.get(i.username) or new_secret() for i in identities}
    layout = None if pki_dir is None else PkiLayout(Path(pki_dir).absolute())
    # The credentials files mostly wait on the disk: write them while hashing and
    # rendering go on, so a render of 10,000 identities costs the slower of the two.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vox-credentials")
    writing = writer.submit(
        _write_credentials,
        identities,
        passwords,
        cred_dir,
        Credentials(username="", password="", host=host, port=tls_port if with_tls else port),
        layout,
    )
    writer.shutdown(wait=False)  # the job runs on; result() below joins it
    hashes = hash_passwords(passwords, {i.id: old_hashes.get(i.username) for i in identities})

    header = [f"vox-mqtt acl_file for {len(identities)} identities: generated, do not edit."]
    if fmt == "acl":
        security_name = "acl"
        security_text = render_acl_file(identities, header=header)
        parsed = parse_acl_file(security_text, source="rendered acl")
        if parsed.warnings:  # pragma: no cover - the renderer never writes these
            raise ConfigError(list(parsed.warnings))
    else:
        security_name = "dynsec.json"
        security_text = render_dynsec(identities, hashes)
        check_dynsec(security_text, source="rendered dynsec.json")

    owner, warning = _owner_of(user)
    warnings = [warning] if warning else []
    tls_files = {**(tls or {}), **bridge_tls}
    if tls_files:
        (root / "tls").mkdir(exist_ok=True, mode=0o700)
        if owner is not None:
            os.chown(root / "tls", *owner)
        for name, data in tls_files.items():
            atomic_write(root / "tls" / name, data, mode=0o600, owner=owner)
    # The bridge's secret must not sit in the world-readable mosquitto.conf.
    bridge_path = root / "bridge" / "bridge.conf"
    if bridge_conf:
        bridge_path.parent.mkdir(exist_ok=True, mode=0o700)
        if owner is not None:
            os.chown(bridge_path.parent, *owner)
        atomic_write(bridge_path, bridge_conf, mode=0o600, owner=owner)
    else:
        bridge_path.unlink(missing_ok=True)
    if fmt == "acl":
        passwd_text = render_passwd({i.username: hashes[i.id] for i in identities})
        atomic_write(root / "passwd", passwd_text, mode=0o600, owner=owner)
    atomic_write(root / security_name, security_text, mode=0o600, owner=owner)
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
    )
    if bridge_conf:
        conf_text += f"\ninclude_dir {bridge_path.parent}\n"
    atomic_write(root / CONF_NAME, conf_text, mode=0o644)

    credentials = writing.result()
    return BrokerDir(
        root=root,
        conf=root / CONF_NAME,
        fmt=fmt,
        acl=root / "acl" if fmt == "acl" else None,
        dynsec=root / "dynsec.json" if fmt == "dynsec" else None,
        passwd=root / "passwd" if fmt == "acl" else None,
        credentials=credentials,
        host=host,
        port=port,
        tls_port=tls_port if with_tls else None,
        warnings=tuple(warnings),
    )


def _conf_settings(conf: Path) -> dict[str, str]:
    try:
        text = conf.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{conf}: cannot read the broker config: {exc.strerror}"]) from None
    settings: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key and not key.startswith("#"):
            settings.setdefault(key, value.strip())
    return settings


def _readable_by(path: Path, user: str) -> bool:
    """Return whether `user` may read path (owner, group or other bits)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return True  # cannot judge here; the broker host is elsewhere
    if entry.pw_uid == 0:
        return True
    st = path.stat()
    if st.st_uid == entry.pw_uid:
        return bool(st.st_mode & 0o400)
    groups = {g for g in os.getgrouplist(user, entry.pw_gid)}
    if st.st_gid in groups:
        return bool(st.st_mode & 0o040)
    return bool(st.st_mode & 0o004)


def _check_is_mosquitto(pid: int) -> None:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        raise BrokerUnavailable(f"no process with pid {pid}: is the broker running?") from None
    except OSError:
        return  # no /proc here: trust the caller
    if comm != "mosquitto":
        raise ConfigError([f"pid {pid} is {comm!r}, not mosquitto: refusing to signal it"])


def reload_broker(
    out_dir: str | Path, *, pid: int, acl_source: str | Path | None = None
) -> ReloadReport:
    """Check the ACL as Mosquitto parses it, install acl_source if given, then SIGHUP."""
    # Nothing is replaced or signalled unless every check passes: the broker keeps
    # enforcing the rules it holds in memory.
    root = Path(out_dir).absolute()
    settings = _conf_settings(root / CONF_NAME)
    if "acl_file" not in settings:
        raise ConfigError(
            [
                f"{root / CONF_NAME} uses the dynamic-security plugin, which Mosquitto 2.0 reads "
                "only at start (SIGHUP ignores dynsec.json): restart the broker to apply it"
            ]
        )
    acl_path = Path(settings["acl_file"])
    user = settings.get("user", DEFAULT_USER)
    source = Path(acl_source) if acl_source is not None else acl_path
    try:
        text = source.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read the ACL: {exc.strerror}"]) from None
    try:
        parsed = parse_acl_file(text, source=str(source))
    except ConfigError as exc:
        raise ConfigError(
            [*exc.problems, f"refusing to reload: Mosquitto would run with NO ACL ({source})"]
        ) from None
    if not parsed.entries:
        raise ConfigError([f"{source}: no rules at all: refusing to reload"])
    problems: list[str] = []
    passwd_path = Path(settings.get("password_file", root / "passwd"))
    try:
        _, pw_problems = parse_passwd(passwd_path.read_text(encoding="utf-8"))
        problems += [f"{passwd_path}: {p} (Mosquitto would drop it)" for p in pw_problems]
    except OSError as exc:
        problems.append(f"{passwd_path}: cannot read the password file: {exc.strerror}")
    for path in (acl_path, passwd_path):
        if path.exists() and not _readable_by(path, user):
            problems.append(f"{path}: not readable by the broker's user `{user}` (chown it)")
    if problems:
        raise ConfigError(problems)
    _check_is_mosquitto(pid)
    replaced = False
    if acl_source is not None:
        st = acl_path.stat() if acl_path.exists() else None
        owner = None if st is None or os.geteuid() != 0 else (st.st_uid, st.st_gid)
        atomic_write(acl_path, text.encode("utf-8", "surrogateescape"), mode=0o600, owner=owner)
        replaced = True
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise BrokerUnavailable(f"no process with pid {pid}: is the broker running?") from None
    except PermissionError:
        raise BrokerUnavailable(
            f"not allowed to signal pid {pid}: run as the broker's owner"
        ) from None
    return ReloadReport(
        acl=acl_path, rules=len(parsed.entries), replaced=replaced, warnings=parsed.warnings
    )
