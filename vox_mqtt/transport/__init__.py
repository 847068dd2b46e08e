"""The MQTT v5 session an agent or a tool holds with its broker (docs/transport.md)."""

from vox_mqtt.transport.session import BrokerSettings, Inbound, Session, Will

__all__ = ["BrokerSettings", "Inbound", "Session", "Will"]
