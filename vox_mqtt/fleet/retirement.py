"""Retire an agent: clear what it left on the broker and tell its master, as the identities
that may (docs/operations.md).

The broker's rules let only an agent write its own status and its own war-room posts, and
only the poster clear a post about it. So retirement logs in with the credentials of the
broker directory, which holds every identity's: the operator's read-only `status` look to
look, the retired agent's to say RETIRED once (live, to whoever watches it: its master)
and to clear its status and posts, and a poster's to clear a leftover post about it when
that poster is not running to resolve it itself (logging in as a running agent would take
over its session where client ids are locked). It runs before the broker is re-rendered
without the agent, while those credentials still work.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final
from uuid import UUID

from vox_mqtt.broker.acl import CANARY_NAME, EXPLORER_NAME, LOOK_PURPOSES
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.manifest import MANIFEST_NAME, FleetRecord, load_manifest
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.signkeys import load_keys
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, INACTIVE, RETIRED, AgentLiveness
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError, VoxError
from vox_mqtt.protocol.hierarchy import Fleet
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.protocol.signing import Signing
from vox_mqtt.transport.session import Session

__all__ = ["RetireReport", "retire_agent", "retire_refusal"]

_CONNECT_TIMEOUT: Final = 5.0


@dataclass(kw_only=True)
class RetireReport:
    """What retirement found and did."""

    name: str
    id: UUID
    last_status: str | None = None  # e.g. "INACTIVE SHUTDOWN, epoch 4"; None if none was kept
    told: bool = False  # the RETIRED status went out (to whoever watches the agent)
    cleared: list[str] = field(default_factory=list)  # retained topics emptied
    resolved_by_poster: list[str] = field(default_factory=list)  # posts their poster cleared
    left: list[str] = field(default_factory=list)  # what is still there, one line each

    @property
    def clean(self) -> bool:
        """Return whether nothing of the agent is left on the broker."""
        return not self.left


def retire_refusal(fleet: Fleet, name: str, record: FleetRecord | None, where: str) -> str | None:
    """Return why `name` may not be retired with this fleet file, or None (a pure check).

    `record` is what the broker directory's render.json says it was rendered from: the
    fleet file must be that fleet (same operator, the same id for every name both know),
    and the agent one of its agents that the file no longer holds.
    """
    special = {"operator", fleet.operator_name, EXPLORER_NAME, CANARY_NAME}
    special |= {f"_{purpose}" for purpose in LOOK_PURPOSES}
    if name in special or name.startswith("_"):
        return (
            f"{name!r} is one of the operator's or the broker's own identities, not an agent: "
            "only an agent is retired"
        )
    if record is None:
        return (
            f"{where} holds no record of the fleet it was rendered from: re-render it from "
            f"the fleet file that still holds {name!r} (`vox broker render OLD --out DIR`), "
            "then retire"
        )
    if record.operator_id != str(fleet.operator_id):
        return (
            f"the fleet file is not the fleet {where} was rendered from (its operator is "
            f"{fleet.operator_id}, the broker's {record.operator_id}): pass that fleet's file"
        )
    moved = sorted(
        agent.name
        for agent in fleet
        if agent.name in record.agents and record.agents[agent.name] != str(agent.id)
    )
    if moved:
        return (
            f"the fleet file is not the fleet {where} was rendered from: {moved[0]!r} has "
            "another id there"
        )
    if name not in record.agents:
        return f"{name!r} is not an agent of the fleet {where} was rendered from"
    with contextlib.suppress(KeyError):
        kept = fleet.agent(name)
        return (
            f"{name!r} ({kept.id}) is still in the fleet file: remove it there first "
            "(`vox fleet diff OLD NEW` shows every step)"
        )
    return None


def _settings(creds: Credentials, client_id: str) -> BrokerSettings:
    # No session is left behind, and an unreachable broker is said quickly.
    return creds.broker_settings(
        client_id=client_id,
        session_expiry=0,
        connect_timeout=_CONNECT_TIMEOUT,
        reconnect_max=5.0,
    )


def _signed(settings: BrokerSettings, root: Path) -> BrokerSettings:
    """Sign as that identity when the broker directory holds its key (docs/security.md)."""
    key = load_keys(root).current.get(UUID(settings.username or ""))
    return settings if key is None else replace(settings, signing=Signing(mode="require", key=key))


def _look_settings(creds: Credentials) -> BrokerSettings:
    """Look as the operator's read-only `status` identity, so no console is taken over."""
    look = creds.look("status")
    if look is None:  # a broker rendered before looks existed: a throw-away client id
        return _settings(creds, f"{creds.username}-retire-{secrets.token_hex(4)}")
    return replace(
        _settings(creds, look.username),
        username=look.username,
        password=look.password,
        cert_file=look.cert_file if creds.tls else None,
        key_file=look.key_file if creds.tls else None,
    )


def _credentials_by_id(broker_dir: Path) -> dict[UUID, Credentials]:
    found: dict[UUID, Credentials] = {}
    store = CredentialStore(broker_dir)
    for name in store.names():
        with contextlib.suppress(ConfigError, ValueError, OSError):
            creds = store.get(name)
            found[UUID(creds.username)] = creds
    return found


def _load(root: Path, name: str, what: str) -> Credentials:
    store = CredentialStore(root)
    if not store.has(name):
        raise ConfigError([f"{store.path}: no credentials for {what}"])
    return store.get(name)


class _Look:
    """The operator's read-only look at one agent's status and the war room."""

    def __init__(self, creds: Credentials, agent_id: UUID) -> None:
        self.agent_id = agent_id
        self.observer = FleetObserver()
        self.session = Session(
            _look_settings(creds),
            subscriptions=[*topics.LIVENESS_FILTERS, topics.WARROOM_FILTER],
            mark_retained_end=True,
        )
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Look:
        await self.session.__aenter__()
        self._pump = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        await self.session.__aexit__(None, None, None)

    async def _run(self) -> None:
        async for inbound in self.session.messages():
            self.observer.take(inbound)

    async def settle(self, limit: float) -> None:
        """Wait until every retained message subscribed to is taken; VoxError after limit s."""
        if not await self.session.caught_up(limit):
            raise VoxError(
                f"the broker had not sent every retained status and incident within {limit:g}s: "
                "retire again with a longer --wait"
            )

    async def until(self, done: Callable[[], bool], limit: float) -> bool:
        """Wait until done() holds, at most limit seconds; return whether it does."""
        deadline = time.monotonic() + limit
        while not done():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    @property
    def status(self) -> AgentLiveness | None:
        self.observer.view.refresh()
        entry = self.observer.view.get(self.agent_id)
        return entry if entry is not None and entry.seen else None

    def posts(self) -> dict[tuple[UUID, UUID], str]:
        """Return the retained war-room posts by or about the agent: (source, subject)."""
        return {
            key: f"{incident.failure.error_code} ({incident.failure.severity})"
            for key, incident in self.observer.incidents.items()
            if self.agent_id in key
        }


def _retired_status(name: str, agent_id: UUID, last: AgentLiveness | None) -> bytes:
    epoch = 0 if last is None else last.epoch + 1
    report = AgentStatus(
        name=name,
        status=INACTIVE,
        error_code=RETIRED,
        epoch=max(0, epoch),
        # No status seen: this one is the first the watchers read of it, authored now.
        started_at=now_iso() if last is None else last.started_at,
        heartbeat_interval=last.heartbeat_interval if last and last.heartbeat_interval else 1.0,
    )
    target = topics.WARROOM_ID if last is None or last.master_id is None else last.master_id
    return serialize(new_message(MSG_AGENT_STATUS, source=agent_id, target=target, details=report))


async def retire_agent(
    fleet: Fleet,
    name: str,
    broker_dir: str | Path,
    *,
    wait: float = 3.0,
    force: bool = False,
) -> RetireReport:
    """Clear a retired agent's status and war-room posts and say RETIRED to its watchers."""
    root = Path(broker_dir)
    manifest = load_manifest(root)
    refusal = retire_refusal(
        fleet, name, None if manifest is None else manifest.fleet, str(root / MANIFEST_NAME)
    )
    if refusal is not None:
        raise ConfigError([refusal])
    agent_creds = _load(
        root,
        name,
        f"{name!r}: retire it before the broker is re-rendered without it (docs/operations.md)",
    )
    agent_id = UUID(agent_creds.username)
    with contextlib.suppress(KeyError):
        if fleet.agent(agent_id):
            raise ConfigError(
                [
                    f"{name!r} ({agent_id}) is still in the fleet file: remove it there first "
                    "(`vox fleet diff OLD NEW` shows every step)"
                ]
            )
    where = (
        "the agent's and the operator's credentials are in different broker directories of "
        "this federated fleet, which retirement does not handle yet (docs/operations.md)"
        if fleet.brokers
        else "render the broker from this fleet file"
    )
    operator_creds = _load(
        root,
        fleet.operator_name,
        f"the operator {fleet.operator_name!r}: {where}",
    )
    report = RetireReport(name=name, id=agent_id)
    async with _Look(operator_creds, agent_id) as look:
        await look.settle(wait)  # its retained status, if the broker holds one, is in
        last = look.status
        if last is not None:
            code = f" {last.error_code}" if last.error_code else ""
            report.last_status = f"{last.status}{code}, epoch {last.epoch}"
            if last.status == ACTIVE and not force:
                raise VoxError(
                    f"{name!r} is still running (ACTIVE, epoch {last.epoch}): stop it first "
                    f"(systemctl disable --now vox-agent@{name}), or pass --force"
                )
        try:
            await _clear_own(look, agent_creds, name, last, report, root)
        except VoxError as exc:
            raise VoxError(
                f"the broker did not let {name!r} clear its topics ({exc}): was it re-rendered "
                "without it already? see docs/operations.md"
            ) from None
        await _clear_others(look, root, agent_id, wait, report)
    # A fresh look sees only what the broker still retains.
    async with _Look(operator_creds, agent_id) as check:
        await check.settle(wait)
        if check.status is not None:
            report.left.append(f"{topics.status(agent_id)} or its presence: still retained")
        noted = {line.split(":", 1)[0] for line in report.left}
        for (source, subject), what in sorted(check.posts().items()):
            topic = topics.warroom(source, subject)
            if topic not in noted:
                report.left.append(f"{topic}: {what} still retained")
    return report


async def _clear_own(
    look: _Look,
    creds: Credentials,
    name: str,
    last: AgentLiveness | None,
    report: RetireReport,
    root: Path,
) -> None:
    """As the agent: say RETIRED live, then clear its status and its own posts."""
    agent_id = look.agent_id
    # Its own client id with no session expiry: the broker drops whatever it still queued
    # for the agent when this connection ends.
    settings = _signed(_settings(creds, creds.client_id), root)
    async with Session(settings, subscriptions=()) as session:
        await session.publish(topics.status(agent_id), _retired_status(name, agent_id, last))
        report.told = True
        for topic in (topics.status(agent_id), topics.presence(agent_id)):
            await session.publish(topic, b"", retain=True)
            report.cleared.append(topic)
        for source, subject in sorted(look.posts()):
            if source == agent_id:
                await session.publish(topics.warroom(source, subject), b"", retain=True)
                report.cleared.append(topics.warroom(source, subject))


async def _clear_others(
    look: _Look, root: Path, agent_id: UUID, wait: float, report: RetireReport
) -> None:
    """Let running posters resolve their posts about the agent; clear the others' posts."""
    others = [key for key in look.posts() if key[0] != agent_id]
    if not others:
        return
    # A running master resolves its incident itself once told (or reloaded).
    await look.until(lambda: not any(key in look.posts() for key in others), wait)
    creds = _credentials_by_id(root)
    for source, subject in others:
        topic = topics.warroom(source, subject)
        if (source, subject) not in look.posts():
            report.resolved_by_poster.append(topic)
            continue
        poster = look.observer.view.get(source)
        if poster is not None and poster.status == ACTIVE:
            # Logging in as a running agent could take over its session: it must resolve
            # the post itself, which it does once its new bundle is reloaded.
            who = poster.name or str(source)
            report.left.append(
                f"{topic}: {who} is running and still holds it: reload it with its new "
                f"bundle (systemctl reload vox-agent@{who})"
            )
            continue
        if source not in creds:
            report.left.append(f"{topic}: no credentials for its poster {source} here")
            continue
        client = f"{creds[source].username}-retire-{secrets.token_hex(4)}"
        settings = _signed(_settings(creds[source], client), root)
        async with Session(settings, subscriptions=()) as session:
            await session.publish(topic, b"", retain=True)
        report.cleared.append(topic)
