"""vox-mqtt: hierarchical agents on edge hosts that talk VOX over MQTT."""

from vox_mqtt._version import __version__
from vox_mqtt.agent.facade import AgentConfig, VOXAgent
from vox_mqtt.agent.roles import Role, command, on
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import (
    BrokerUnavailable,
    CommandFailed,
    ConfigError,
    DeliveryFailed,
    FleetError,
    InvalidMessage,
    LedgerError,
    Refused,
    SubscriptionRefused,
    TopicError,
    VoxError,
)
from vox_mqtt.protocol.hierarchy import AgentSpec, AgentView, Fleet, load_fleet, parse_fleet
from vox_mqtt.protocol.messages import VOXMessage, new_message, parse, serialize
from vox_mqtt.protocol.topics import WARROOM_ID
from vox_mqtt.transport.session import BrokerSettings

__all__ = [
    "WARROOM_ID",
    "AgentConfig",
    "AgentSpec",
    "AgentView",
    "BrokerSettings",
    "BrokerUnavailable",
    "CommandFailed",
    "ConfigError",
    "DeliveryFailed",
    "Fleet",
    "FleetError",
    "InvalidMessage",
    "LedgerError",
    "OperatorConsole",
    "Refused",
    "Role",
    "SubscriptionRefused",
    "TopicError",
    "VOXAgent",
    "VOXAgentMemory",
    "VOXMessage",
    "VoxError",
    "__version__",
    "command",
    "load_fleet",
    "new_message",
    "on",
    "parse",
    "parse_fleet",
    "serialize",
]
