"""Session's subscriptions: added and dropped on the live connection and kept for every
reconnect, made on each new connection, and where their retained messages end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from vox_mqtt.protocol.errors import SubscriptionRefused
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.packets import reason_name
from vox_mqtt.transport.wire import (
    RETAINED_END_TOPIC,
    Connection,
    ConnectionLost,
    Received,
    Subscription,
)

__all__ = ["Subscribing"]

log = logging.getLogger("vox_mqtt.transport.session")  # the session's log, as before the split

# A SUBACK code from here on refuses the subscription (MQTT v5, 3.9.3).
_REFUSED_FROM = 0x80
# What goes wrong with an (un)subscribe on a connection that drops or does not answer.
_LINK_TROUBLE = (ConnectionLost, TimeoutError)
# The marker's message: QoS 0, so that nothing acknowledges it.
_MARKER = Received(
    topic=RETAINED_END_TOPIC, payload=b"", retain=False, qos=0, mid=0, properties=None
)

# How long the marker's SUBACK may take: it comes after every retained message its
# subscriptions brought, thousands of them in a large fleet (docs/federation.md, sizing).
_MARKER_TIMEOUT = 300.0


class Subscribing:
    """The subscription part of Session (transport/session.py), which sets these attributes."""

    settings: BrokerSettings
    subscriptions: tuple[str, ...]
    _link: Connection | None  # the connection that is up and set up
    _marks_end: bool  # Session(mark_retained_end=True): see Session.__init__
    _caught_up: asyncio.Event
    _tg: asyncio.TaskGroup | None

    async def subscribe(self, filters: Sequence[str]) -> None:
        """Add subscriptions: at once on the live connection, and on every reconnect after.

        Raise SubscriptionRefused (and keep none of them) if the broker refuses one.
        """
        new = [topic for topic in dict.fromkeys(filters) if topic not in self.subscriptions]
        if not new:
            return
        self.subscriptions = (*self.subscriptions, *new)
        client = self._link
        if client is None:
            return  # the next connection subscribes to all of them
        try:
            codes = await client.subscribe(
                [Subscription(topic) for topic in new], timeout=self.settings.connect_timeout
            )
        except _LINK_TROUBLE as exc:
            log.warning("subscribing to %s: %s; the next connection subscribes", new, exc)
            return
        refused = [topic for topic, code in zip(new, codes, strict=False) if code >= _REFUSED_FROM]
        if refused:
            self.subscriptions = tuple(t for t in self.subscriptions if t not in new)
            with contextlib.suppress(*_LINK_TROUBLE):
                await client.unsubscribe(new, timeout=self.settings.connect_timeout)
            raise SubscriptionRefused(
                f"the broker refused the subscription to {refused[0]!r} — check the broker's ACL",
                topic=refused[0],
            )

    async def unsubscribe(self, filters: Sequence[str]) -> None:
        """Drop subscriptions, at once on the live connection and for every reconnect."""
        gone = [topic for topic in filters if topic in self.subscriptions]
        if not gone:
            return
        self.subscriptions = tuple(t for t in self.subscriptions if t not in gone)
        client = self._link
        if client is not None:
            with contextlib.suppress(*_LINK_TROUBLE):
                await client.unsubscribe(gone, timeout=self.settings.connect_timeout)

    async def _subscribe(self, client: Connection) -> None:
        self._caught_up.clear()
        if not self.subscriptions:
            self._caught_up.set()  # nothing retained is coming
            return
        codes = await client.subscribe(
            [Subscription(topic, qos=0 if self._marks_end else 1) for topic in self.subscriptions],
            timeout=self.settings.connect_timeout,
        )
        for topic, code in zip(self.subscriptions, codes, strict=False):
            if code >= _REFUSED_FROM:
                raise SubscriptionRefused(
                    f"the broker refused client {client.identifier}'s subscription to {topic!r}: "
                    f"{reason_name(code)} (0x{code:02X}) — check the broker's ACL",
                    topic=topic,
                )
        if self._marks_end:
            assert self._tg is not None
            self._tg.create_task(self._mark_retained_end(client))

    async def _mark_retained_end(self, client: Connection) -> None:
        """Mark where the retained messages of the subscriptions just made end.

        The broker writes a subscription's retained QoS 0 messages before it answers the next
        SUBSCRIBE, so the SUBACK of the same filters again, with retain-handling 2 (send none),
        comes after all of them, unless the broker dropped some for lack of queue room
        (`max_queued_messages`, sized to the fleet by `vox broker render`: docs/broker.md).
        They come back at QoS 1: at QoS 0 nothing paces the live messages, and a look that
        falls behind piles them up in this process (a 10,000-agent look never caught up).
        """
        filters = [Subscription(topic, send_retained=False) for topic in self.subscriptions]
        try:
            await client.subscribe(filters, timeout=_MARKER_TIMEOUT)
        except _LINK_TROUBLE:
            return  # the connection went: the next one marks its own end
        client.mark(_MARKER)
