"""The per-host config files: one agent daemon's, or the operator console's (TOML)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from vox_mqtt.protocol.boundedfile import (
    MAX_CONFIG_BYTES,
    MAX_SECRET_BYTES,
    MAX_TLS_FILE_BYTES,
    check_regular,
    read_regular,
)
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import MAX_CHILDREN
from vox_mqtt.protocol.messages import MAX_HEARTBEAT_INTERVAL
from vox_mqtt.protocol.settings import AgentConfig, BrokerSettings
from vox_mqtt.protocol.signing import (
    CLOCK_SKEW,
    REPLAY_WINDOW,
    Keyring,
    SealKey,
    Signing,
    SigningKey,
    key_id,
)
from vox_mqtt.protocol.topics import WARROOM_FILTER, WARROOM_ID

__all__ = [
    "BrokerSection",
    "ConsoleFile",
    "DaemonFile",
    "SigningSection",
    "load_console_config",
    "load_daemon_config",
]

Seconds = Annotated[float, Field(gt=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerSection(_Section):
    """How to reach the fleet broker, and as whom."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 1883
    username: str
    password: str | None = None
    password_file: Path | None = None  # a credentials file rendered by `vox broker render`
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive: Annotated[int, Field(ge=2, le=65535)] = 30
    session_expiry: Annotated[int, Field(ge=0)] = 3600
    # How long one connection attempt, and the first connection with its retries, may take
    # before the broker is called unreachable (docs/transport.md).
    connect_timeout: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # The first reconnect try's window and the backoff's cap: `vox agent render` sizes them
    # to the agents on the broker (docs/federation.md, "Restarts and partitions").
    reconnect_min: Annotated[float, Field(gt=0, le=3600)] = 0.5
    reconnect_max: Annotated[float, Field(gt=0, le=3600)] = 30.0

    def client_id_locked(self, base: Path) -> bool:
        """Tell whether the credentials file says the broker locks client ids to usernames."""
        if self.password_file is None:
            return False
        return self._credentials(base).get("client_id_locked") is True

    def _credentials(self, base: Path) -> dict[str, Any]:
        path = _resolve_path(base, self.password_file or Path())
        try:
            raw = read_regular(path, limit=MAX_SECRET_BYTES)
            return tomllib.loads(raw.decode("utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([f"{path}: cannot read the broker credentials: {exc}"]) from None

    def settings(self, client_id: str, *, base: Path) -> BrokerSettings:
        """Return the transport settings, reading the password file if one is named."""
        password = self.password
        if password is None and self.password_file is not None:
            password = self._credentials(base).get("password")
            if not isinstance(password, str):
                path = _resolve_path(base, self.password_file)
                raise ConfigError([f"{path}: no password in the credentials file"])
        # The TLS files are read at each connection: a FIFO or a device there is refused now.
        tls = [_resolve(base, name) for name in (self.ca_file, self.cert_file, self.key_file)]
        problems = [
            why
            for path in tls
            if path is not None
            and (why := check_regular(path, limit=MAX_TLS_FILE_BYTES)) is not None
        ]
        if problems:
            raise ConfigError([f"broker TLS file {why}" for why in problems])
        return BrokerSettings(
            host=self.host,
            port=self.port,
            username=self.username,
            password=password,
            client_id=client_id,
            ca_file=_resolve(base, self.ca_file),
            cert_file=_resolve(base, self.cert_file),
            key_file=_resolve(base, self.key_file),
            keepalive=self.keepalive,
            session_expiry=self.session_expiry,
            connect_timeout=self.connect_timeout,
            reconnect_min=self.reconnect_min,
            reconnect_max=max(self.reconnect_max, self.reconnect_min),
        )


class SigningSection(_Section):
    """Whether this identity signs and verifies, and the keys file `vox agent render` wrote."""

    mode: Literal["require", "accept", "off"] = "require"
    keys_file: Path  # its own private key and its peers' public keys (0600)
    # A signed message older than this (plus the skew) is refused STALE, and its sender stops
    # re-sending it at this age: the fleet file's replay_window (docs/security.md).
    replay_window: Seconds = REPLAY_WINDOW
    clock_skew: Annotated[float, Field(ge=0, le=3600)] = CLOCK_SKEW

    def signing(self, base: Path) -> Signing:
        """Return the keys, read from the keys file (bounded, regular files only)."""
        path = _resolve_path(base, self.keys_file)
        try:
            data = tomllib.loads(read_regular(path, limit=MAX_CONFIG_BYTES).decode("utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([f"{path}: cannot read the signing keys: {exc}"]) from None
        try:
            current: dict[UUID, dict[str, bytes]] = {}
            retired: dict[str, tuple[UUID, bytes]] = {}
            outgoing: dict[UUID, str] = {}
            roster: dict[UUID, tuple[str | None, UUID | None]] = {}
            for owner, entry in dict(data.get("peers", {})).items():
                who = UUID(owner)
                name, master = entry.get("name"), entry.get("master")
                roster[who] = (
                    name if isinstance(name, str) and name else None,
                    None if master is None else UUID(master),
                )
                current[who] = {key_id(k): k for k in map(bytes.fromhex, entry["keys"])}
                for old in map(bytes.fromhex, entry.get("retired", [])):  # oldest first
                    retired[key_id(old)] = (who, old)
                    outgoing[who] = key_id(old)
            seal_key = data.get("seal_key")
            return Signing(
                mode=self.mode,
                key=SigningKey(bytes.fromhex(data["key"])) if "key" in data else None,
                keyring=Keyring(current=current, retired=retired, outgoing=outgoing),
                seal_to=bytes.fromhex(data["seal_to"]) if "seal_to" in data else None,
                seal_key=None if seal_key is None else SealKey(bytes.fromhex(seal_key)),
                replay_window=self.replay_window,
                clock_skew=self.clock_skew,
                roster=roster,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                [f"{path}: not a signing keys file from `vox agent render`: {exc}"]
            ) from None


class AgentSection(_Section):
    """One agent: itself, its master and its direct children, and nothing else of the tree."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    id: UUID
    master_id: UUID
    master_name: str = "master"
    children: dict[UUID, str] = Field(default_factory=dict)
    roles: list[Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]] = Field(
        default_factory=list
    )
    settings: dict[str, Any] = Field(default_factory=dict)
    state_dir: Path
    message_source: str = "vox-mqtt"
    # Keep message_source in clear in the ledger (a keyed digest otherwise: docs/ledger.md).
    ledger_clear_sources: bool = False
    # Bounded like any status a master believes (docs/liveness.md).
    heartbeat_interval: Annotated[float, Field(gt=0, le=MAX_HEARTBEAT_INTERVAL)] = 15.0
    stale_after: Annotated[float, Field(ge=1)] = 3.0
    request_timeout: Seconds = 30.0
    max_concurrency: Annotated[int, Field(ge=1, le=10_000)] = 32
    # What one child's events may cost (docs/security.md, F25): a rate, a backlog.
    child_rate: Annotated[float, Field(gt=0, le=1_000_000)] = 10.0
    child_backlog: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    quiet_publishes: Annotated[int, Field(ge=1, le=1_000_000)] = 500
    shutdown_grace: Seconds = 10.0
    disk_alert_percent: Annotated[float, Field(gt=0, le=100)] = 95.0
    memory_alert_percent: Annotated[float, Field(gt=0, le=100)] = 95.0
    watch_warroom: bool = False  # only the root may read the war room
    ledger_sync: Literal["full", "normal"] = "full"  # see docs/ledger.md

    @field_validator("children")
    @classmethod
    def _children_below(cls, children: dict[UUID, str], info: ValidationInfo) -> dict[UUID, str]:
        """Children are agents below this one: never itself, its master or the war room."""
        if len(children) > MAX_CHILDREN:
            raise ValueError(
                f"{len(children)} children, more than the {MAX_CHILDREN} one agent may have "
                "(their subscriptions must fit the broker's packet limit: docs/operations.md)"
            )
        reserved = {
            info.data.get("id"): "the agent itself",
            info.data.get("master_id"): "its master",
            WARROOM_ID: "the war room's id",
            UUID(int=0): "the nil UUID",
        }
        for child, name in children.items():
            if child in reserved:
                raise ValueError(f"{child} ({name!r}) is {reserved[child]}, not a child")
        return children

    def agent_config(self, broker: BrokerSettings, *, base: Path) -> AgentConfig:
        """Return the runtime config of this agent (the one place a section becomes one)."""
        return AgentConfig(
            id=self.id,
            name=self.name,
            master_id=self.master_id,
            master_name=self.master_name,
            children=dict(self.children),
            state_dir=_resolve_path(base, self.state_dir),
            broker=broker,
            message_source=self.message_source,
            ledger_clear_sources=self.ledger_clear_sources,
            heartbeat_interval=self.heartbeat_interval,
            stale_after=self.stale_after,
            request_timeout=self.request_timeout,
            max_concurrency=self.max_concurrency,
            child_rate=self.child_rate,
            child_backlog=self.child_backlog,
            quiet_publishes=self.quiet_publishes,
            disk_alert_percent=self.disk_alert_percent,
            memory_alert_percent=self.memory_alert_percent,
            observe=(WARROOM_FILTER,) if self.watch_warroom else (),
            ledger_sync=self.ledger_sync,
        )


class OperatorSection(_Section):
    """The human's console: the root's master."""

    name: str = "operator"
    id: UUID
    root_id: UUID
    root_name: str = "root"
    state_dir: Path
    request_timeout: Seconds = 30.0

    def agent_config(
        self, broker: BrokerSettings, *, base: Path, observe: Sequence[str] = ()
    ) -> AgentConfig:
        """Return the console's runtime config: the root's master, publishing no status."""
        return AgentConfig(
            id=self.id,
            name=self.name,
            master_id=None,
            children={self.root_id: self.root_name},
            state_dir=_resolve_path(base, self.state_dir),
            broker=broker,
            publish_status=False,
            request_timeout=self.request_timeout,
            observe=tuple(observe),
        )


class DaemonFile(_Section):
    """A daemon config file: `[agent]` and `[broker]`."""

    kind: Literal["agent"] = "agent"
    agent: AgentSection
    broker: BrokerSection
    signing: SigningSection | None = None  # absent: signatures "off" (docs/security.md)

    def agent_config(self, base: Path) -> AgentConfig:
        """Return the runtime config of this agent."""
        broker = self.broker.settings(str(self.agent.id), base=base)
        if self.signing is not None:
            broker = replace(broker, signing=self.signing.signing(base))
        return self.agent.agent_config(broker, base=base)


class ConsoleFile(_Section):
    """The operator console's config file: `[operator]` and `[broker]`."""

    kind: Literal["operator"] = "operator"
    operator: OperatorSection
    broker: BrokerSection
    signing: SigningSection | None = None  # absent: signatures "off" (docs/security.md)

    def agent_config(
        self, base: Path, *, client_id: str | None = None, observe: Sequence[str] = ()
    ) -> AgentConfig:
        """Return the runtime config of the console: the root's master, publishing no status."""
        op = self.operator
        broker = self.broker.settings(client_id or str(op.id), base=base)
        if client_id is not None and client_id != str(op.id):
            if self.broker.client_id_locked(base):
                # The broker would make it the operator's own client id: it would take over
                # the operator's session and the answers queued there (docs/broker.md).
                raise ConfigError([_SECOND_CONSOLE_REFUSED])
            # A second, read-only console keeps no session behind it.
            broker = replace(broker, session_expiry=0)
        if self.signing is not None:
            broker = replace(broker, signing=self.signing.signing(base))
        return op.agent_config(broker, base=base, observe=observe)


_SECOND_CONSOLE_REFUSED = (
    "the broker locks client ids to usernames, so a second console as the operator would "
    "take over the operator's own session (and the answers queued in it): look with "
    "`vox status` or `vox watch`, which log in as looks of their own"
)


def _resolve_path(base: Path, path: Path) -> Path:
    """Resolve a path relative to the config file's folder, so a rendered dir can move."""
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def _resolve(base: Path, path: Path | None) -> Path | None:
    return None if path is None else _resolve_path(base, path)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = read_regular(path, limit=MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such config file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read the config file: {exc}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None


def _problems(path: Path, exc: ValidationError) -> ConfigError:
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        lines.append(f"{path}: {where}: {message}")
    return ConfigError(lines)


def load_daemon_config(path: str | Path) -> DaemonFile:
    """Read and validate a daemon config; raise ConfigError with one line per problem."""
    path = Path(path)
    data = _read(path)
    if data.get("kind", "agent") != "agent":
        raise ConfigError([f"{path}: this is a {data.get('kind')!r} config, not an agent's"])
    try:
        return DaemonFile.model_validate(data)
    except ValidationError as exc:
        raise _problems(path, exc) from None


def load_console_config(path: str | Path) -> ConsoleFile:
    """Read and validate the operator console's config; raise ConfigError per problem."""
    path = Path(path)
    data = _read(path)
    if data.get("kind") != "operator":
        raise ConfigError(
            [f"{path}: not an operator config (render one with `vox agent render FLEET operator`)"]
        )
    try:
        return ConsoleFile.model_validate(data)
    except ValidationError as exc:
        raise _problems(path, exc) from None
