"""The plain settings of one agent and its broker connection: data, no behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from uuid import UUID

from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.messages import MAX_HEARTBEAT_INTERVAL, MAX_MESSAGE_BYTES
from vox_mqtt.protocol.signing import Signing
from vox_mqtt.protocol.sitelinks import LinkMap

__all__ = ["AgentConfig", "BrokerSettings", "Will"]


@dataclass(frozen=True, kw_only=True)
class BrokerSettings:
    """Where the broker is and how this identity connects to it."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_id: str
    ca_file: Path | None = None  # TLS when set
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive: int = 30
    session_expiry: int = 3600
    connect_timeout: float = 10.0
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    publish_timeout: float = 10.0
    # What this identity signs with and whom it believes (docs/security.md); None: "off".
    signing: Signing | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not self.client_id:
            problems.append("client_id must not be empty (it is the agent's UUID)")
        if not 0 < self.port < 65536:
            problems.append(f"port {self.port} is not a TCP port (1-65535)")
        if min(self.keepalive, self.connect_timeout, self.publish_timeout, self.reconnect_min) <= 0:
            problems.append("keepalive, the timeouts and reconnect_min must be > 0")
        if self.reconnect_max < self.reconnect_min:
            problems.append("reconnect_max must be >= reconnect_min")
        if (self.cert_file or self.key_file) and self.ca_file is None:
            problems.append("cert_file and key_file need ca_file (TLS is on when ca_file is set)")
        if problems:
            raise ConfigError([f"broker settings: {p}" for p in problems])

    @property
    def address(self) -> str:
        """Return host:port, for messages."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class Will:
    """The message the broker publishes if this connection ends without a DISCONNECT."""

    topic: str
    payload: bytes
    retain: bool = True
    qos: int = 1
    content_type: str | None = "application/json"
    # MQTT v5 user properties an explorer shows beside it (docs/topics.md).
    user_properties: tuple[tuple[str, str], ...] = ()
    # MQTT v5 message expiry: the broker counts it down from when it publishes the will,
    # so a reader learns the loss's time by the broker's clock (docs/liveness.md).
    message_expiry: int | None = None


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything one agent knows: itself, its master, its children and its broker."""

    id: UUID
    name: str
    master_id: UUID | None  # None only for the operator's console, the root's master
    master_name: str = "master"
    children: Mapping[UUID, str] = field(default_factory=dict)  # id -> name
    state_dir: Path
    broker: BrokerSettings
    message_source: str = "vox-mqtt"
    ledger_clear_sources: bool = False  # message_source in clear in the ledger, not a digest
    publish_status: bool = True
    heartbeat_interval: float = 15.0
    stale_after: float = 3.0  # heartbeat intervals
    max_concurrency: int = 32  # command handlers running at once
    max_intake: int = 256  # inbound messages being recorded/acknowledged at once
    request_timeout: float = 30.0
    resend_initial: float = 1.0
    resend_max: float = 8.0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    disk_alert_percent: float = 95.0  # own host checks that open a war-room incident
    memory_alert_percent: float = 95.0
    observe: Sequence[str] = ()  # extra topic filters (the operator: every status, war room)
    metrics: bool = True  # count the agent's work (docs/metrics.md); off only to measure it
    links: LinkMap | None = None  # bridge links to watch in a federated fleet (sitelinks.py)
    # What one child's events may cost this agent (docs/security.md, F25): this many a
    # second once `child_backlog` came at once, and at most `child_backlog` of them in work
    # here at a time (handled, or sent on and not yet acknowledged). Beyond: refused unacked.
    child_rate: float = 10.0
    child_backlog: int = 100
    # Publishes to a peer this agent has not heard from since (docs/security.md, F25):
    # beyond this many only answers go out, so a flood cannot fill its queue at the broker.
    quiet_publishes: int = 500
    # The ledger's durability: "full" survives a power cut, "normal" a killed process only
    # (docs/ledger.md, "Durable before acknowledged").
    ledger_sync: Literal["full", "normal"] = "full"

    def __post_init__(self) -> None:
        bounds = (
            ("child_rate", self.child_rate > 0),
            ("child_backlog", self.child_backlog >= 1),
            ("quiet_publishes", self.quiet_publishes >= 1),
        )
        for name, fine in bounds:
            if not fine:
                raise ConfigError([f"agent {self.name}: {name} must be at least 1 (over 0)"])
        # What its own status says must be within what its master believes (docs/liveness.md).
        if not 0 < self.heartbeat_interval <= MAX_HEARTBEAT_INTERVAL:
            raise ConfigError(
                [
                    f"agent {self.name}: heartbeat_interval {self.heartbeat_interval:g} must be"
                    f" over 0 and at most {MAX_HEARTBEAT_INTERVAL:g} s"
                ]
            )

    @property
    def peers(self) -> frozenset[UUID]:
        """Return the only agents this one may talk to: its master and children."""
        ids = set(self.children)
        if self.master_id is not None:
            ids.add(self.master_id)
        return frozenset(ids)
