"""A bare Session's settings and a plain broker config for the transport tests."""

from __future__ import annotations

import getpass
from collections.abc import Callable
from uuid import uuid4

from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.transport.session import BrokerSettings

Factory = Callable[..., LocalBroker]
USER = getpass.getuser()


def settings(port: int, **overrides: object) -> BrokerSettings:
    """Return settings for a fresh client id on port, quick to connect and to reconnect."""
    values: dict[str, object] = {
        "client_id": str(uuid4()),
        "connect_timeout": 5.0,
        "publish_timeout": 5.0,
        "reconnect_min": 0.05,
        "reconnect_max": 0.5,
    }
    values.update(overrides)
    return BrokerSettings(port=port, **values)  # type: ignore[arg-type]


def conf(*lines: str, persistence: bool = False) -> str:
    """Return a broker config on loopback with these lines ({port}, {dir} filled in later)."""
    base = ["listener {port} 127.0.0.1", f"user {USER}", "log_dest stderr", "log_type all"]
    if persistence:
        base += ["persistence true", "persistence_location {dir}/"]
    return "\n".join([*base, *lines, ""])
