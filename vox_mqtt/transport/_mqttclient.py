"""The login check's connection (transport/probe.py), on the transport's own wire.

What probe.py expects of a client, kept while it uses one of its own: connect, subscribe
once, close. Everything is transport/wire.py's; nothing here reaches into an MQTT library.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from vox_mqtt.protocol.settings import BrokerSettings, Will
from vox_mqtt.transport.failures import broker_error, tls_context
from vox_mqtt.transport.packets import reason_name
from vox_mqtt.transport.wire import (
    Connection,
    ConnectionLost,
    Subscription,
    connect,
)

__all__ = ["LoginCheck", "broker_error", "new_client", "tls_context"]


@dataclass(frozen=True)
class SubscribeCode:
    """One SUBACK reason code, as probe.py reads it."""

    value: int

    @property
    def is_failure(self) -> bool:
        """The broker refused the subscription."""
        return self.value >= 0x80

    def __str__(self) -> str:
        return reason_name(self.value)


class LoginCheck:
    """One connection attempt as probe.py drives it."""

    def __init__(
        self, s: BrokerSettings, will: Will | None, tls: ssl.SSLContext | None, receive_max: int
    ) -> None:
        self._settings, self._will, self._tls, self._receive_max = s, will, tls, receive_max
        self._link: Connection | None = None
        self.connect_error: BaseException | None = None

    async def __aenter__(self) -> LoginCheck:
        """Connect; the CONNACK accepted the login."""
        try:
            self._link = await connect(
                self._settings, will=self._will, tls=self._tls, receive_maximum=self._receive_max
            )
        except Exception as exc:
            self.connect_error = exc
            raise
        return self

    async def subscribe(
        self, filters: Sequence[tuple[str, SubscribeOptions]], timeout: float
    ) -> list[SubscribeCode]:
        """Subscribe; return the SUBACK's codes (aiomqtt.MqttError if the link fails)."""
        assert self._link is not None
        wanted = [Subscription(topic, qos=options.QoS) for topic, options in filters]
        try:
            codes = await self._link.subscribe(wanted, timeout)
        except (ConnectionLost, TimeoutError) as exc:
            raise aiomqtt.MqttError(str(exc) or "no SUBACK in time") from None
        return [SubscribeCode(code) for code in codes]

    def abort(self) -> None:
        """Close without DISCONNECT."""
        if self._link is not None:
            self._link.abort()

    async def close(self) -> None:
        """DISCONNECT, bounded (wire.Connection.close)."""
        if self._link is not None:
            await self._link.close()


def new_client(
    s: BrokerSettings, *, will: Will | None, tls: ssl.SSLContext | None, receive_maximum: int
) -> LoginCheck:
    """Build (not connect) the connection of one login check."""
    return LoginCheck(s, will, tls, receive_maximum)
