"""vox-mqtt: hierarchical agents on edge hosts that talk VOX over MQTT."""

from ._version import __version__
from .agent import AgentConfig, VOXAgent
from .console import OperatorConsole
from .errors import (
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
from .hierarchy import AgentSpec, AgentView, Fleet, load_fleet, parse_fleet
from .ledger import VOXAgentMemory
from .messages import VOXMessage, new_message, parse, serialize
from .roles import Role, command, on
from .topics import WARROOM_ID
from .transport import BrokerSettings

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
