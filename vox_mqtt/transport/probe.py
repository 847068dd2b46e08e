"""A login check: log in, subscribe once, leave, and take nothing from the session."""

from __future__ import annotations

from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.session import Session

__all__ = ["probe_login"]


async def probe_login(s: BrokerSettings, subscribe: str) -> None:
    """Log in as s says, subscribe to one filter at QoS 1, disconnect; acknowledge nothing.

    One attempt (Session(retry=False)): raise BrokerUnavailable, Refused for a refused login
    or a TLS failure, SubscriptionRefused for a refused subscription. One message at most
    reaches this client before it leaves (Receive Maximum 1), and it is never acknowledged,
    so what the session holds stays queued for its owner (Session(acknowledge=False)).
    """
    async with Session(s, subscriptions=[subscribe], retry=False, acknowledge=False):
        pass
