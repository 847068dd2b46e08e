"""Apply a re-rendered dynsec.json to a running broker live, through its control topic.

Mosquitto 2.0 reads dynsec.json only at start, and a SIGHUP is a risk of its own
(docs/broker.md), so a changed fleet reaches a dynamic-security broker as commands
on `$CONTROL/dynamic-security/v1`, sent by the `_admin` identity whose credentials
exist only in the broker directory. Only what differs is sent: an agent whose role
and secret did not change keeps its session. The canary then proves the rules.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from vox_mqtt.broker.acl import (
    ADMIN_NAME,
    CANARY_NAME,
    DYNSEC_CONTROL,
    canary_forbidden_topic,
    canary_topic,
)
from vox_mqtt.broker.aclcheck import check_dynsec, dynsec_hashes
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.lastgood import LAST_GOOD, keep_last_good
from vox_mqtt.broker.manifest import file_digest, load_manifest, write_manifest
from vox_mqtt.broker.passwd import Credentials, PasswordHash
from vox_mqtt.broker.policy import dynsec_answers, load_policy, policy_problems
from vox_mqtt.broker.probe import one_shot_settings, probe_rules, watch_broker
from vox_mqtt.protocol.errors import BrokerUnavailable, ConfigError, Refused, VoxError
from vox_mqtt.transport.blocking import BlockingSession

__all__ = ["ApplyReport", "DynsecApplyFailed", "apply_dynsec", "plan_commands"]

_RESPONSE: Final = f"{DYNSEC_CONTROL}/response"
_BATCH: Final = 200
_ACL_KEYS: Final = ("acltype", "topic", "allow")
Acl = tuple[str, str, bool]


class DynsecApplyFailed(VoxError):
    """The broker refused a command or did not prove the new rules."""


@dataclass(frozen=True, kw_only=True)
class ApplyReport:
    """What was sent to the broker and what the canary saw."""

    commands: int
    summary: Mapping[str, int]
    proof: str
    watched: float = 0.0


@dataclass(frozen=True, kw_only=True)
class _State:
    clients: Mapping[str, tuple[str, ...]]  # username -> role names
    roles: Mapping[str, frozenset[Acl]]
    texts: Mapping[str, str]


def _state(clients: Iterable[Mapping[str, Any]], roles: Iterable[Mapping[str, Any]]) -> _State:
    return _State(
        clients={c["username"]: tuple(r["rolename"] for r in c.get("roles", [])) for c in clients},
        roles={
            r["rolename"]: frozenset(
                (a["acltype"], a["topic"], bool(a["allow"])) for a in r.get("acls", [])
            )
            for r in roles
        },
        texts={c["username"]: str(c.get("textName", c.get("textname", ""))) for c in clients},
    )


def _acl_fields(acl: Acl) -> dict[str, Any]:
    return dict(zip(_ACL_KEYS, acl, strict=True))


def _acl(rolename: str, acl: Acl, command: str) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command, "rolename": rolename, **_acl_fields(acl)}
    if command == "removeRoleACL":
        body.pop("allow")
    return body


def plan_commands(
    current: _State,
    desired: _State,
    secrets: Mapping[str, str],
    applied_hashes: Mapping[str, PasswordHash],
    keep: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Return the control commands that turn current into desired, touching nothing else."""
    kept = set(keep)
    commands: list[dict[str, Any]] = []
    for name, acls in desired.roles.items():
        if name not in current.roles:
            acl_list = [_acl_fields(a) for a in sorted(acls)]
            commands.append({"command": "createRole", "rolename": name, "acls": acl_list})
            continue
        old = current.roles[name]
        commands += [_acl(name, a, "addRoleACL") for a in sorted(acls - old)]
        commands += [_acl(name, a, "removeRoleACL") for a in sorted(old - acls)]
    for username, roles in desired.clients.items():
        secret = secrets.get(username)
        if username not in current.clients:
            if secret is None:
                raise ConfigError([f"no credentials file holds the secret of {username}"])
            commands.append(
                {
                    "command": "createClient",
                    "username": username,
                    "password": secret,
                    "textname": desired.texts.get(username, ""),
                    "roles": [{"rolename": r} for r in roles],
                }
            )
            continue
        for role in sorted(set(roles) - set(current.clients[username])):
            commands.append({"command": "addClientRole", "username": username, "rolename": role})
        for role in sorted(set(current.clients[username]) - set(roles)):
            commands.append({"command": "removeClientRole", "username": username, "rolename": role})
        applied = applied_hashes.get(username)
        # Only a secret that really changed is set: the broker disconnects that client.
        if secret is not None and applied is not None and not applied.verify(secret):
            commands.append(
                {"command": "setClientPassword", "username": username, "password": secret}
            )
    for username in current.clients:
        if username not in desired.clients and username not in kept:
            commands.append({"command": "deleteClient", "username": username})
    for name in current.roles:
        if name not in desired.roles and name not in kept:
            commands.append({"command": "deleteRole", "rolename": name})
    return commands


class _Control:
    """The admin's MQTT v5 session on the control topic: commands out, responses back."""

    def __init__(self, admin: Credentials, timeout: float) -> None:
        self._responses: dict[str, dict[str, Any]] = {}
        self._session = BlockingSession(
            one_shot_settings(admin, timeout), subscriptions=[_RESPONSE]
        )

    def start(self) -> None:
        """Log in and subscribe to the responses; raise if the admin may not."""
        try:
            self._session.__enter__()
        except Refused as exc:
            raise DynsecApplyFailed(
                f"`{ADMIN_NAME}` may not use the control topic: {exc}"
            ) from None
        except BrokerUnavailable as exc:
            timeout = self._session.settings.connect_timeout
            raise DynsecApplyFailed(
                f"no subscription of `{ADMIN_NAME}` to the control topic within {timeout:g} s "
                f"({exc}): is the broker stopped, or not a dynsec broker?"
            ) from None

    def call(self, commands: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
        """Send commands in one message and return their responses, in order."""
        # The plugin echoes each command's correlationData in its response.
        keys = [f"{uuid.uuid4()}" for _ in commands]
        tagged = [{**c, "correlationData": k} for c, k in zip(commands, keys, strict=True)]
        payload = json.dumps({"commands": tagged}).encode()
        deadline = time.monotonic() + timeout  # one bound for the PUBACK and the answers
        outcome = self._session.publish(DYNSEC_CONTROL, payload, timeout=timeout)
        if not outcome.accepted:
            raise DynsecApplyFailed(str(outcome.error(DYNSEC_CONTROL)))
        while not all(k in self._responses for k in keys):
            left = deadline - time.monotonic()
            message = self._session.receive(left) if left > 0 else None
            if message is None and not self._session.connected:
                raise DynsecApplyFailed(
                    "the connection to the broker dropped before it answered on the control "
                    "topic: the commands may or may not have been applied"
                )
            if message is None:
                raise DynsecApplyFailed("the broker did not answer on the control topic")
            self._take(message.payload)
        return [self._responses.pop(k) for k in keys]

    def _take(self, payload: bytes) -> None:
        try:
            responses = json.loads(payload).get("responses", [])
        except (ValueError, AttributeError):
            return
        for response in responses if isinstance(responses, list) else ():
            if isinstance(response, dict):
                self._responses[str(response.get("correlationData"))] = response

    def close(self) -> None:
        """Disconnect."""
        self._session.close()


def _current(control: _Control, timeout: float) -> _State:
    listed = control.call(
        [
            {"command": "listClients", "verbose": True, "count": -1},
            {"command": "listRoles", "verbose": True, "count": -1},
        ],
        timeout,
    )
    errors = [r.get("error") for r in listed if r.get("error")]
    if errors:
        raise DynsecApplyFailed(f"the broker would not list its clients and roles: {errors[0]}")
    return _state(listed[0]["data"]["clients"], listed[1]["data"]["roles"])


def _desired(root: Path) -> _State:
    path = root / "dynsec.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: cannot read the rendered rules: {exc}"]) from None
    return _state(document.get("clients", []), document.get("roles", []))


def _applied_hashes(root: Path) -> dict[str, PasswordHash]:
    try:
        return dynsec_hashes((root / LAST_GOOD / "dynsec.json").read_text(encoding="utf-8"))
    except OSError:
        return {}


def _send(
    admin: Credentials,
    desired: _State,
    secrets: Mapping[str, str],
    applied: Mapping[str, PasswordHash],
    timeout: float,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Turn the broker's rules into desired; return the commands sent and the refusals."""
    control = _Control(admin, timeout)
    try:
        control.start()
        current = _current(control, timeout)
        commands = plan_commands(current, desired, secrets, applied, keep=(admin.username,))
        failures = []
        for start in range(0, len(commands), _BATCH):
            batch = commands[start : start + _BATCH]
            for command, response in zip(batch, control.call(batch, timeout), strict=False):
                if response.get("error"):
                    failures.append(f"{command['command']}: {response['error']}")
    finally:
        control.close()
    return commands, failures


def _go_back(
    root: Path, admin: Credentials, secrets: Mapping[str, str], problem: str, timeout: float
) -> str:
    """Re-apply the rules last proven (last-good/); return the one loud line to print."""
    failed = f"APPLY FAILED: {problem}"
    try:
        document = json.loads((root / LAST_GOOD / "dynsec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{failed}; no previous rules were kept: fix the broker now"
    previous = _state(document.get("clients", []), document.get("roles", []))
    # Secrets are not rolled back: an identity re-keyed by this render keeps its new one.
    try:
        commands, failures = _send(admin, previous, secrets, {}, timeout)
    except (BrokerUnavailable, DynsecApplyFailed) as exc:
        return (
            f"{failed}; the previous rules could not be re-applied ({exc}): the broker may "
            "hold the new ones, fix it now"
        )
    if failures:
        return f"{failed}; re-applying the previous rules failed too: {failures[0]}"
    return f"{failed}; re-applied the previous rules ({len(commands)} command(s))"


def _refuse_unproven(root: Path, path: Path) -> None:
    """Refuse, before anything is sent, rules that open the broker or break the policy."""
    text = path.read_text(encoding="utf-8")
    check_dynsec(text, source=str(path))  # an open defaultACLAccess is refused here too
    document = json.loads(text)
    probes = load_policy(root)
    if probes is None:
        return
    wrong, first = policy_problems(probes, dynsec_answers(document))
    if wrong:
        raise ConfigError(
            [
                f"{path}: refusing to apply: {wrong} of the fleet's {len(probes)} probed paths "
                f"would change ({'; '.join(first)})"
            ]
        )


def apply_dynsec(
    out_dir: str | Path,
    *,
    timeout: float = 10.0,
    accept_edit: bool = False,
    watch: float = 0.0,
    pid: int | None = None,
    endpoints: tuple[tuple[str, int], ...] = (),
) -> ApplyReport:
    """Send what differs between the broker's rules and dynsec.json; prove them with the canary.

    Then, for `watch` seconds, the broker (pid, when given) must stay up and every
    endpoint accept connections.
    """
    root = Path(out_dir).absolute()
    manifest = load_manifest(root)
    if manifest is None or manifest.canary_nonce is None:
        raise ConfigError([f"{root}: no render.json: render it with `vox broker render` first"])
    path = root / "dynsec.json"
    try:
        digest = file_digest(path.read_bytes())
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the rendered rules: {exc.strerror}"]) from None
    if digest != manifest.files.get("dynsec.json") and not accept_edit:
        raise ConfigError(
            [
                f"{path}: not the dynsec.json `vox broker render` wrote (its digest differs from "
                "render.json): re-render, or pass --accept-edit to apply a hand edit"
            ]
        )
    _refuse_unproven(root, path)
    desired = _desired(root)
    store = CredentialStore(root)
    admin, canary = store.get(ADMIN_NAME), store.get(CANARY_NAME)
    secrets = store.passwords()
    commands, failures = _send(admin, desired, secrets, _applied_hashes(root), timeout)
    problem = None
    if failures:
        problem = f"the broker refused {len(failures)} command(s), first: {failures[0]}"
    else:
        proof = probe_rules(
            canary,
            allowed=canary_topic(manifest.canary_nonce),
            forbidden=canary_forbidden_topic(),
            pid=None,
            timeout=timeout,
        )
        problem = None if proof.ok else proof.reason
    if problem is not None:
        raise DynsecApplyFailed(_go_back(root, admin, secrets, problem, timeout))
    keep_last_good(root, ("dynsec.json",))
    # The plugin saved its state over the rendered file: that is now what render vouched for.
    files = {**manifest.files, "dynsec.json": file_digest(path.read_bytes())}
    write_manifest(root, replace(manifest, files=files))
    if watch > 0:
        crashed = watch_broker(pid, endpoints, watch)
        if crashed is not None:
            raise DynsecApplyFailed(
                f"APPLY FAILED: {crashed}: the canary had proven the new rules, which the "
                "plugin saved and a restarted broker loads (systemd: Restart=on-failure); "
                "the broker's log says why it stopped"
            )
    summary: dict[str, int] = {}
    for command in commands:
        summary[command["command"]] = summary.get(command["command"], 0) + 1
    return ApplyReport(commands=len(commands), summary=summary, proof=proof.reason, watched=watch)
