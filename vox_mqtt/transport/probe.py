"""A login check: log in, subscribe once, leave, and take nothing from the session."""

from __future__ import annotations

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from vox_mqtt.protocol.errors import SubscriptionRefused
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport._mqttclient import broker_error, new_client, tls_context

__all__ = ["probe_login"]


async def probe_login(s: BrokerSettings, subscribe: str) -> None:
    """Log in as s says, subscribe to one filter at QoS 1, disconnect; acknowledge nothing.

    Raise BrokerUnavailable (Refused for a refused login, a TLS failure, or a refused
    subscription). One message at most reaches this client before it leaves (Receive Maximum
    1), and it is never acknowledged, so what the session holds stays queued for its owner.
    """
    client = new_client(s, will=None, tls=tls_context(s), receive_maximum=1)
    try:
        await client.__aenter__()
    except Exception as exc:
        client.abort()
        raise broker_error(client.connect_error or exc, s) from None
    try:
        codes = await client.subscribe(
            [(subscribe, SubscribeOptions(qos=1))], timeout=s.connect_timeout
        )
    except aiomqtt.MqttError as exc:
        raise broker_error(exc, s) from None
    finally:
        await client.close()
    code = codes[0] if codes else None
    if code is None or getattr(code, "is_failure", False):
        raise SubscriptionRefused(
            f"the broker at {s.address} accepted the login of {s.username} but refused the "
            f"subscription to {subscribe!r}: {code} — check the broker's ACL (docs/broker.md)",
            topic=subscribe,
        )
