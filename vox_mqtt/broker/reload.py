"""`vox broker reload`: install only what render wrote, signal, prove it, or go back.

The procedure (docs/broker.md):
1. the files must be the bytes `vox broker render` wrote (render.json's digests),
   unless the operator accepts a hand edit explicitly;
2. they must be bytes Mosquitto reads exactly as we do, and parse as it parses them;
3. SIGHUP, then the canary proves the broker is alive and enforcing these rules;
4. if not, the previous files go back, the broker is signalled again, and the
   reload fails loudly;
5. then the broker is watched for a while: a crash after the proof fails loudly too.
A TLS listener that takes the certificate as the username is never signalled unless
asked (Mosquitto 2.0 crashes after such a SIGHUP, docs/broker.md "SIGHUP and TLS").
With the dynamic-security plugin there is no signal at all: see dynsec.py.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vox_mqtt.broker.acl import CANARY_NAME, canary_forbidden_topic
from vox_mqtt.broker.aclcheck import AclFile, parse_acl_file
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.lastgood import keep_last_good, restore_last_good
from vox_mqtt.broker.manifest import Manifest, file_digest, load_manifest, write_manifest
from vox_mqtt.broker.passwd import Credentials, atomic_write, parse_passwd
from vox_mqtt.broker.policy import acl_answers, load_policy, policy_problems
from vox_mqtt.broker.probe import ProbeResult, alive, probe_rules, watch_broker
from vox_mqtt.broker.text import broker_file_text
from vox_mqtt.protocol.errors import BrokerUnavailable, ConfigError, VoxError

__all__ = [
    "ReloadFailed",
    "ReloadReport",
    "broker_settings",
    "check_is_mosquitto",
    "conf_directives",
    "listener_endpoints",
    "reload_broker",
    "tls_sighup_refusal",
]

CONF_NAME: Final = "mosquitto.conf"
DEFAULT_USER: Final = "mosquitto"
VERIFY_TIMEOUT: Final = 10.0
# How long `vox broker reload` watches the broker after a proven reload (docs/broker.md).
WATCH_SECONDS: Final = 20.0
_CERT_AS_USERNAME: Final = ("use_identity_as_username", "use_subject_as_username")
# Mosquitto acts on SIGHUP at the end of its current loop turn: give it that turn.
_SIGNAL_SETTLE: Final = 0.2


class ReloadFailed(VoxError):
    """The broker did not prove the new rules; the previous files were put back."""


@dataclass(frozen=True, kw_only=True)
class ReloadReport:
    """What reload_broker checked, installed, signalled and proved."""

    acl: Path
    rules: int
    replaced: bool
    warnings: tuple[str, ...]
    proof: str = ""
    accepted_edits: tuple[str, ...] = ()
    watched: float = 0.0


def broker_settings(root: Path) -> dict[str, str]:
    """Return the first value of each directive of the rendered mosquitto.conf."""
    conf = root / CONF_NAME
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


def conf_directives(text: str) -> list[tuple[str, str]]:
    """Return every (directive, value) of a mosquitto.conf, in order, comments left out."""
    pairs = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#"):
            pairs.append((key, value.strip()))
    return pairs


def listener_endpoints(directives: list[tuple[str, str]]) -> tuple[tuple[str, int], ...]:
    """Return the (address, port) of every listener, a wildcard bind as 127.0.0.1."""
    endpoints = []
    for key, value in directives:
        if key != "listener":
            continue
        port, _, bind = value.partition(" ")
        if not port.isdigit():
            continue
        host = bind.strip() or "127.0.0.1"
        endpoints.append(("127.0.0.1" if host in ("0.0.0.0", "::") else host, int(port)))
    return tuple(endpoints)


def tls_sighup_refusal(conf: Path, directives: list[tuple[str, str]]) -> str | None:
    """Return the line refusing to SIGHUP a broker whose certificates are usernames, or None.

    On such a listener Mosquitto 2.0 (to 2.0.22) disconnects every offline persistent
    session again on SIGHUP and puts it on the session-expiry list a second time; the
    stale entry crashes the broker later (docs/broker.md, "SIGHUP and TLS").
    """
    if not any(k in _CERT_AS_USERNAME and v.lower() == "true" for k, v in directives):
        return None
    return (
        f"{conf}: refusing to SIGHUP a TLS broker that takes certificates as usernames: "
        "Mosquitto 2.0 crashes after such a reload while a persistent session is offline "
        "(docs/broker.md, SIGHUP and TLS); re-render with --format dynsec (applied live, "
        "no signal) or restart the broker to load the rendered files (--tls-sighup "
        "signals anyway)"
    )


def _read_conf(root: Path) -> list[tuple[str, str]]:
    conf = root / CONF_NAME
    try:
        return conf_directives(conf.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{conf}: cannot read the broker config: {exc.strerror}"]) from None


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
    groups = set(os.getgrouplist(user, entry.pw_gid))
    if st.st_gid in groups:
        return bool(st.st_mode & 0o040)
    return bool(st.st_mode & 0o004)


def check_is_mosquitto(pid: int) -> None:
    """Refuse to signal anything but a running mosquitto."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        raise BrokerUnavailable(f"no process with pid {pid}: is the broker running?") from None
    except OSError:
        return  # no /proc here: trust the caller
    if comm != "mosquitto":
        raise ConfigError([f"pid {pid} is {comm!r}, not mosquitto: refusing to signal it"])


def _signal_as_owner(pid: int) -> bool:
    """Send SIGHUP from a child that became the broker's user; return whether it could."""
    # Under the broker unit's capability bounds root has CAP_SETUID but not CAP_KILL:
    # a process may always signal its own user's processes.
    st = Path(f"/proc/{pid}").stat()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(st.st_gid)
            os.setuid(st.st_uid)
            os.kill(pid, signal.SIGHUP)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _signal(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGHUP)
        return
    except ProcessLookupError:
        raise BrokerUnavailable(f"no process with pid {pid}: is the broker running?") from None
    except PermissionError:
        if os.geteuid() == 0 and _signal_as_owner(pid):
            return
    raise BrokerUnavailable(f"not allowed to signal pid {pid}: run as root or as the broker's user")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the {what}: {exc.strerror}"]) from None


def _check_digests(
    manifest: Manifest | None,
    root: Path,
    data: dict[str, bytes],
    sources: dict[str, Path],
    accept_edit: bool,
) -> list[str]:
    """Return the files that differ from what render wrote; refuse them unless accepted."""
    if manifest is None:
        if accept_edit:
            return sorted(data)
        raise ConfigError(
            [
                f"{root}: no render.json: render this directory with `vox broker render` first "
                "(or pass --accept-edit to install files render did not write)"
            ]
        )
    edited = [n for n, d in sorted(data.items()) if manifest.files.get(n) != file_digest(d)]
    if edited and not accept_edit:
        raise ConfigError(
            [
                f"{sources[n]}: not the {n} `vox broker render` wrote (its digest differs from "
                "render.json): re-render, or pass --accept-edit to install a hand edit"
                for n in edited
            ]
        )
    return edited


def _canary_topic(parsed: AclFile, canary: Credentials, source: Path) -> str:
    topics = [e.topic for e in parsed.rules_of(canary.username) if e.write and not e.deny]
    if len(topics) != 1 or "+" in topics[0] or "#" in topics[0]:
        raise ConfigError(
            [
                f"{source}: no single literal topic for the canary `{CANARY_NAME}` "
                f"({canary.username}): the reload could not be proven; re-render the ACL"
            ]
        )
    return topics[0]


def _canary(root: Path) -> Credentials:
    return CredentialStore(root).get(CANARY_NAME)


def _parse(data: dict[str, bytes], sources: dict[str, Path]) -> tuple[AclFile, list[str]]:
    problems: list[str] = []
    try:
        acl_text = broker_file_text(data["acl"], source=str(sources["acl"]))
        parsed = parse_acl_file(acl_text, source=str(sources["acl"]))
    except ConfigError as exc:
        raise ConfigError(
            [
                *exc.problems,
                f"refusing to reload: Mosquitto would run with NO ACL ({sources['acl']})",
            ]
        ) from None
    if not parsed.entries:
        raise ConfigError([f"{sources['acl']}: no rules at all: refusing to reload"])
    try:
        pw_text = broker_file_text(data["passwd"], source=str(sources["passwd"]))
        _, pw_problems = parse_passwd(pw_text)
        problems += [f"{sources['passwd']}: {p} (Mosquitto would drop it)" for p in pw_problems]
    except ConfigError as exc:
        problems += exc.problems
    return parsed, problems


def _policy_refusal(root: Path, source: Path, parsed: AclFile) -> list[str]:
    """Return one line when the ACL to install does not hold the fleet's policy."""
    probes = load_policy(root)
    if probes is None:
        return []  # rendered before policy.json: the canary alone proves the reload
    wrong, first = policy_problems(probes, acl_answers(parsed))
    if not wrong:
        return []
    return [
        f"{source}: refusing to reload: {wrong} of the fleet's {len(probes)} probed paths "
        f"would change ({'; '.join(first)})"
    ]


def reload_broker(
    out_dir: str | Path,
    *,
    pid: int,
    acl_source: str | Path | None = None,
    accept_edit: bool = False,
    verify_timeout: float = VERIFY_TIMEOUT,
    watch: float = 0.0,
    tls_sighup: bool = False,
) -> ReloadReport:
    """Check, install, SIGHUP, prove and watch the broker; raise ReloadFailed if not.

    `watch` seconds after the proof the broker must still run and accept connections on
    every listener; `tls_sighup` signals a broker tls_sighup_refusal would refuse.
    """
    # Nothing is replaced or signalled unless every check passes: the broker keeps
    # enforcing the rules it holds in memory.
    root = Path(out_dir).absolute()
    settings = broker_settings(root)
    if "acl_file" not in settings:
        raise ConfigError(
            [
                f"{root / CONF_NAME} uses the dynamic-security plugin: `vox broker reload` "
                "applies it live, without a signal (docs/broker.md)"
            ]
        )
    directives = _read_conf(root)
    refusal = tls_sighup_refusal(root / CONF_NAME, directives)
    if refusal is not None and not tls_sighup:
        raise ConfigError([refusal])
    acl_path = Path(settings["acl_file"])
    passwd_path = Path(settings.get("password_file", root / "passwd"))
    user = settings.get("user", DEFAULT_USER)
    sources = {"acl": Path(acl_source) if acl_source else acl_path, "passwd": passwd_path}
    data = {name: _read(path, name) for name, path in sources.items()}
    manifest = load_manifest(root)
    edited = _check_digests(manifest, root, data, sources, accept_edit)
    parsed, problems = _parse(data, sources)
    if settings.get("allow_anonymous", "false").lower() != "false":
        problems.append(
            f"{root / CONF_NAME}: allow_anonymous is not false: a login without credentials "
            "would be let in; refusing to reload (re-render the broker)"
        )
    problems += _policy_refusal(root, sources["acl"], parsed)
    canary = _canary(root)
    allowed = _canary_topic(parsed, canary, sources["acl"])
    for path in (acl_path, passwd_path):
        if path.exists() and not _readable_by(path, user):
            problems.append(f"{path}: not readable by the broker's user `{user}` (chown it)")
    if problems:
        raise ConfigError(problems)
    check_is_mosquitto(pid)
    replaced = acl_source is not None
    if replaced:
        st = acl_path.stat() if acl_path.exists() else None
        owner = None if st is None or os.geteuid() != 0 else (st.st_uid, st.st_gid)
        mode = 0o600 if st is None else st.st_mode & 0o777
        atomic_write(acl_path, data["acl"], mode=mode, owner=owner)
    _signal(pid)
    time.sleep(_SIGNAL_SETTLE)
    proof = probe_rules(
        canary, allowed=allowed, forbidden=canary_forbidden_topic(), pid=pid, timeout=verify_timeout
    )
    if not proof.ok:
        raise ReloadFailed(_go_back(root, pid, canary, proof, verify_timeout))
    keep_last_good(root, ("acl", "passwd"))
    if edited and manifest is not None:
        files = {**manifest.files, **{n: file_digest(data[n]) for n in edited}}
        accepted = (*manifest.accepted_edits, *edited)
        write_manifest(root, dataclasses.replace(manifest, files=files, accepted_edits=accepted))
    if watch > 0:
        crashed = watch_broker(pid, listener_endpoints(directives), watch)
        if crashed is not None:
            raise ReloadFailed(f"RELOAD FAILED: {crashed}: {_AFTER_PROOF}")
    return ReloadReport(
        acl=acl_path,
        rules=len(parsed.entries),
        replaced=replaced,
        warnings=parsed.warnings,
        proof=proof.reason,
        accepted_edits=tuple(edited),
        watched=watch,
    )


_AFTER_PROOF: Final = (
    "the canary had proven the new rules, which stay installed and are what a restarted "
    "broker loads (systemd: Restart=on-failure); the broker's log says why it stopped"
)


def _go_back(root: Path, pid: int, canary: Credentials, proof: ProbeResult, timeout: float) -> str:
    """Restore the previous files, signal again and return the one loud line to print."""
    failed = f"RELOAD FAILED: {proof.reason}"
    restored = restore_last_good(root, ("acl", "passwd"))
    if not restored:
        return f"{failed}; no previous files were kept: the new ones stay, fix the broker now"
    what = " and ".join(restored)
    if not alive(pid):
        return (
            f"{failed}; restored the previous {what}: the broker (pid {pid}) is gone and will "
            "load them when it restarts (systemd: Restart=on-failure)"
        )
    _signal(pid)
    time.sleep(_SIGNAL_SETTLE)
    try:
        old = parse_acl_file(
            broker_file_text((root / "acl").read_bytes(), source="restored acl"),
            source="restored acl",
        )
        allowed = _canary_topic(old, canary, root / "acl")
    except (ConfigError, OSError):
        return f"{failed}; restored the previous {what} and signalled again (not provable)"
    back = probe_rules(
        canary, allowed=allowed, forbidden=canary_forbidden_topic(), pid=pid, timeout=timeout
    )
    state = "the previous rules are in force"
    if not back.ok:
        state = f"AND THE RESTORE FAILED TOO: {back.reason}"
    return f"{failed}; restored the previous {what} and signalled again: {state}"
