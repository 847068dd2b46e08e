"""vox-mqtt: hierarchical agents on edge hosts that talk VOX over MQTT."""

from ._version import __version__
from .errors import (
    BrokerUnavailable,
    CommandFailed,
    ConfigError,
    DeliveryFailed,
    FleetError,
    InvalidMessage,
    LedgerError,
    TopicError,
    VoxError,
)
from .hierarchy import AgentSpec, AgentView, Fleet, load_fleet, parse_fleet
from .messages import VOXMessage, new_message, parse, serialize
from .topics import WARROOM_ID

__all__ = [
    "WARROOM_ID",
    "AgentSpec",
    "AgentView",
    "BrokerUnavailable",
    "CommandFailed",
    "ConfigError",
    "DeliveryFailed",
    "Fleet",
    "FleetError",
    "InvalidMessage",
    "LedgerError",
    "TopicError",
    "VOXMessage",
    "VoxError",
    "__version__",
    "load_fleet",
    "new_message",
    "parse",
    "parse_fleet",
    "serialize",
]
