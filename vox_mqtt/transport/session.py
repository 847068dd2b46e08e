"""The MQTT v5 session of one identity: persistent, reconnecting, with an honest publish outcome."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from vox_mqtt.protocol.errors import BrokerUnavailable, DeliveryFailed, Refused, SubscriptionRefused
from vox_mqtt.protocol.settings import BrokerSettings, Will
from vox_mqtt.protocol.signing import RETIRED_KEY, SignedTopic, Signing
from vox_mqtt.protocol.storm import backoff_window
from vox_mqtt.transport._mqttclient import (
    Client,
    broker_error,
    new_client,
    publish_properties,
    tls_context,
)
from vox_mqtt.transport.received import MAX_BATCH, Inbound, verdicts
from vox_mqtt.transport.signing import (
    Presigned,
    Verdict,
    own_key_renewed,
    presign,
    signed_properties,
    signed_will,
)

__all__ = ["BrokerSettings", "Inbound", "Session", "Will", "refused_publish"]

log = logging.getLogger(__name__)

# MQTT v5 Receive Maximum: unacknowledged messages the broker may push at once. We send the
# PUBACK only once a message is in the session queue, so a slow consumer makes the broker keep
# the rest in the persistent session instead of this process buffering without bound.
_RECEIVE_MAXIMUM = 100
_STABLE = 10.0  # seconds a connection must last before the reconnect backoff starts over


def refused_publish(topic: str, rc: ReasonCode) -> DeliveryFailed:
    """Return the error for a PUBACK that refused a publish, in words a person can act on."""
    hint = " — the broker's ACL does not let this client publish there"
    return DeliveryFailed(
        f"the broker refused the message on {topic!r}: {rc} (0x{rc.value:02X})"
        + (hint if rc.value == 0x87 else ""),
        reason_code=rc.value,
    )


class Session:
    """One identity's MQTT session, kept alive across broker restarts and network cuts.

    Persistent (clean_start False on every connect, session expiry): messages published to
    its subscriptions while it is away are delivered when it is back. A PUBACK only means
    "queued in the peer's memory" (paho acks inbound QoS 1 before any handler runs); making a
    message durable is the VOX acknowledgement's job (docs/transport.md).
    """

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        subscriptions: Sequence[str],
        will: Callable[[], Will | None] | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        on_disconnect: Callable[[BaseException | None], Awaitable[None]] | None = None,
        max_queued: int = 10000,
        wait: bool = True,
    ) -> None:
        self.settings = settings
        self.subscriptions = tuple(subscriptions)
        self.connection_count = 0  # successful CONNACKs so far
        self.session_present = False  # the broker still held our session at the latest CONNACK
        self.reconnect_window = settings.reconnect_min  # the latest try's (protocol/storm.py)
        self._will = will
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._wait = wait
        self._queue: asyncio.Queue[Inbound | None] = asyncio.Queue(max(1, max_queued))
        self._link: Client | None = None  # the connection that is up and set up
        self._setting_up: Client | None = None  # the one on_connect is running on
        self._ready = asyncio.Event()
        self._closing = self._abrupt = False
        self._tls: ssl.SSLContext | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._last_error: BrokerUnavailable | None = None
        self._first_logged = ""  # the last cause logged while the first connect is retried
        self._spare_will: tuple[Will | None] | None = None
        self.forged = 0  # messages delivered with a forgery verdict
        self.unsigned = 0  # unsigned messages let through in "accept" mode
        self.on_unsigned: Callable[[], None] | None = None  # told of each (the agent counts)
        self.on_forgery: Callable[[str, str], None] | None = None  # (topic, problem)
        self._held: collections.deque[Inbound] = collections.deque()  # taken, to judge
        self._judged: collections.deque[Inbound] = collections.deque()  # judged, to yield

    @property
    def queued(self) -> int:
        """Return how many received messages wait for the reader of messages()."""
        return self._queue.qsize()

    @property
    def connected(self) -> bool:
        """Return whether a connection is up and its on_connect has completed."""
        return self._link is not None

    async def __aenter__(self) -> Session:
        """Start connecting; unless wait=False, return once the first connection is ready."""
        if self._tg is not None:
            raise RuntimeError("a Session can be entered only once")
        self._tls = tls_context(self.settings)
        self._first = asyncio.get_running_loop().create_future() if self._wait else None
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._runner = self._tg.create_task(self._run(), name=f"vox-mqtt {self.settings.client_id}")
        try:
            if self._first is not None:
                async with asyncio.timeout(self.settings.connect_timeout):
                    await self._first
        except TimeoutError:
            error = self._unreachable(self.settings.connect_timeout)
            await self._shutdown()
            raise error from None
        except BaseException:
            await self._shutdown()
            raise
        self._first = None
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Disconnect gracefully (the broker discards the will) and stop every task."""
        await self._shutdown()

    async def disconnect_abruptly(self) -> None:
        """Drop the connection without DISCONNECT, as a crash would, and end the session."""
        self._abrupt = True
        if self._link is not None:
            self._link.abort()
        await self._shutdown()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Return once connected; raise BrokerUnavailable after timeout seconds."""
        try:
            async with asyncio.timeout(timeout):
                while self._link is None and not self._closing:
                    await self._ready.wait()
        except TimeoutError:
            pass
        if self._link is None:
            raise self._unreachable(timeout)

    async def messages(self) -> AsyncIterator[Inbound]:
        """Yield inbound messages, across reconnects, until the session ends.

        Each is yielded with the verdict on its signature; those waiting together are judged
        together, a batch verified on a thread (transport/received.py), in order.
        """
        while True:
            if not self._judged:
                if not self._held:
                    if self._closing and self._queue.empty():
                        return
                    item = await self._queue.get()
                    if item is None:
                        self._queue.put_nowait(None)  # let any other reader stop too
                        return
                    self._take(item)
                await self._judge()  # cancelled: the held messages are judged next time
            yield self._judged.popleft()

    def _take(self, first: Inbound) -> None:
        """Hold first and what waits behind it: judged together."""
        self._held.append(first)
        while len(self._held) < MAX_BATCH and not self._queue.empty():
            item = self._queue.get_nowait()
            if item is None:
                self._queue.put_nowait(None)  # the end, after the held ones
                break
            self._held.append(item)

    async def _judge(self) -> None:
        signing = self.settings.signing
        held = list(self._held)
        if signing is None or signing.mode == "off":
            judged = held
        else:
            said = await verdicts(signing, [(i.topic, i.payload, i.raw_properties) for i in held])
            judged = [self._believed(i, v) for i, v in zip(held, said, strict=True)]
        self._held.clear()
        self._judged.extend(judged)

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        expiry: int | None = None,
        content_type: str | None = "application/json",
        props: Properties | None = None,
    ) -> None:
        """Return once the broker accepted the message; raise DeliveryFailed otherwise.

        Waits for a connection for up to publish_timeout; the same deadline covers the PUBACK.
        `props`, when given, are sent as they are (built once by the caller, see
        publishprops.py); expiry and content_type then belong in them.
        """
        if expiry is not None and expiry < 1:
            raise ValueError(f"message expiry must be >= 1 s, not {expiry}")
        if props is None:
            props = publish_properties(content_type, expiry)
        props = signed_properties(self.settings.signing, topic, payload, props)
        timeout = self.settings.publish_timeout
        rc: ReasonCode | None = None
        sent = False
        try:
            async with asyncio.timeout(timeout):
                while rc is None:  # None: that connection is gone, wait for the next one
                    client = await self._live_client()
                    sent = True
                    rc = await client.publish_checked(topic, payload, qos, retain, props)
                    sent = False
        except TimeoutError:
            if sent:
                raise DeliveryFailed(
                    f"the broker did not acknowledge the message on {topic!r} within {timeout:g}s"
                ) from None
            raise DeliveryFailed(f"not sent to {topic!r}: {self._unreachable(timeout)}") from None
        if rc.is_failure:
            raise refused_publish(topic, rc)

    def publish_soon(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        content_type: str | None = "application/json",
        props: Properties | None = None,
        presigned: Presigned | None = None,
    ) -> asyncio.Future[ReasonCode] | None:
        """Publish at QoS 1 on the live connection only; return the future of its PUBACK
        (DeliveryFailed if that connection drops first), or None with no connection up."""
        client = self._link
        if self._closing or client is None or client.lost.done():
            return None
        if props is None:
            props = publish_properties(content_type, None)
        props = signed_properties(self.settings.signing, topic, payload, props, presigned)
        return client.publish_soon(topic, payload, 1, retain, props)

    def presign(self, topic: str, payload: bytes) -> Presigned | None:
        """Start signing a publish to come on the signing thread (transport/signing.py)."""
        return presign(self.settings.signing, topic, payload)

    def use_signing(self, signing: Signing | None) -> bool:
        """Sign and verify with these keys from now on (a rotation picked up on SIGHUP).

        A new own key reconnects once, cleanly (the broker discards the old will), so that
        the will is registered signed with it (docs/security.md); return whether it does.
        """
        renewed = own_key_renewed(self.settings.signing, signing)
        self.settings = replace(self.settings, signing=signing)
        if not renewed or self._will is None or self._link is None:
            return False
        log.info("%s: a new signing key: reconnecting once for its will", self.settings.client_id)
        self._link.disconnect_soon()
        return True

    def _inbound(self, topic: str, message: aiomqtt.Message | mqtt.MQTTMessage) -> Inbound:
        """Wrap a received message; messages() judges its signature (docs/security.md)."""
        return Inbound(
            topic=topic,
            payload=bytes(message.payload),
            retain=bool(message.retain),
            raw_properties=message.properties,
        )

    def _believed(self, inbound: Inbound, verdict: Verdict) -> Inbound:
        """Return inbound with the verdict on its signature; count and log a refusal."""
        topic = inbound.topic
        if verdict.unsigned:
            self.unsigned += 1
            if self.on_unsigned is not None:
                self.on_unsigned()
        if verdict.forgery is not None:
            self.forged += 1
            # A retained copy signed with a retired key is what the broker kept from before a
            # rotation, until its agent's birth under the new key replaces it: refused all the
            # same, but no sign of forgery (docs/security.md, rotation).
            kept = inbound.retain and verdict.forgery.startswith(RETIRED_KEY)
            if self.on_forgery is not None and not kept:
                self.on_forgery(topic, verdict.forgery)
            log.log(
                logging.INFO if kept else logging.WARNING,
                "%s: refused a %smessage on %s: %s",
                self.settings.client_id,
                "retained " if kept else "",
                topic,
                verdict.forgery,
            )
        elif verdict.signature is not None:
            topic = SignedTopic.of(topic, verdict.signature, verdict.digest)  # for the ledger
        return Inbound(
            topic=topic,
            payload=inbound.payload,
            retain=inbound.retain,
            raw_properties=inbound.raw_properties,
            signature=verdict.signature,
            forgery=verdict.forgery,
            digest=verdict.digest,
        )

    def _unreachable(self, timeout: float | None) -> BrokerUnavailable:
        if self._closing:
            return BrokerUnavailable(f"the MQTT session of {self.settings.client_id} is closed")
        waited = f" within {timeout:g}s" if timeout is not None else ""
        last = f": {self._last_error}" if self._last_error is not None else ""
        return BrokerUnavailable(f"not connected to {self.settings.address}{waited}{last}")

    async def _live_client(self) -> Client:
        """Return the connection to publish on, waiting for one while there is none."""
        while True:
            if self._closing:
                raise DeliveryFailed(f"the MQTT session of {self.settings.client_id} is closed")
            # on_connect's own publishes (the birth) go out on the connection being set up.
            for client in (self._link, self._setting_up):
                if client is not None and not client.lost.done():
                    return client
            if self._link is not None:
                self._mark_down(self._link)
            await self._ready.wait()

    def _mark_down(self, client: Client) -> None:
        if self._link is client:
            self._link = None
            self._ready.clear()

    async def _shutdown(self) -> None:
        if self._closing or self._tg is None:
            return
        self._closing = True
        self._ready.set()  # wake waiting publishers: they see the session closed
        if self._runner is not None:
            self._runner.cancel()  # its connection's tasks end with it
        # Exit the group without the caller's exception: it must not come back wrapped.
        await self._tg.__aexit__(None, None, None)
        if not self._queue.full():
            self._queue.put_nowait(None)

    def _new_client(self) -> Client:
        s = self.settings
        if self._spare_will is not None:  # the last attempt never sent its CONNECT
            (will,), self._spare_will = self._spare_will, None
        else:
            will = signed_will(s.signing, self._will() if self._will is not None else None)
        return new_client(s, will=will, tls=self._tls, receive_maximum=_RECEIVE_MAXIMUM)

    async def _open(self) -> Client:
        """Make one connection attempt; raise BrokerUnavailable saying why it failed."""
        client = self._new_client()
        attempt = asyncio.ensure_future(client.__aenter__())
        try:
            await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # paho's blocking connect runs in a thread that cannot be interrupted: let it end
            # (bounded by connect_timeout) so no half-open connection is left behind.
            await asyncio.wait({attempt})
            if not attempt.cancelled() and attempt.exception() is None:
                await client.close()
            raise
        except Exception as exc:
            client.abort()
            rc = getattr(exc, "rc", None)
            refused = isinstance(rc, ReasonCode) and rc.is_failure
            # No CONNECT went out, or the broker refused it (e.g. a secret re-keyed before
            # this agent was told): the will was never registered, so keep it and its epoch.
            if client.connect_error is not None or refused:
                self._spare_will = (client.will,)
            raise broker_error(client.connect_error or exc, self.settings) from None
        client.lost.add_done_callback(client.fail_pending)
        return client

    async def _run(self) -> None:
        """Connect, carry the connection until it drops, back off (protocol/storm.py), repeat."""
        failures = 0
        while True:
            started = asyncio.get_running_loop().time()
            try:
                cause = await self._serve(await self._open())
            except BrokerUnavailable as exc:  # includes a drop while setting up
                self._failed(exc, fatal=isinstance(exc, Refused))
            except Exception as exc:  # on_connect failed, e.g. the birth was refused
                self._failed(exc, fatal=True)
            else:
                # Only a connection that lasted starts the backoff over: two processes with one
                # identity (the broker drops the older) must not take turns at full speed.
                if asyncio.get_running_loop().time() - started >= _STABLE:
                    failures = 0
                self._last_error = cause
                log.warning("%s; reconnecting", cause)
            s, failures = self.settings, failures + 1
            self.reconnect_window = backoff_window(s.reconnect_min, failures - 1, s.reconnect_max)
            await asyncio.sleep(random.uniform(0, self.reconnect_window))

    def _failed(self, exc: Exception, *, fatal: bool) -> None:
        if isinstance(exc, BrokerUnavailable):
            self._last_error = exc
        if self._first is not None and not self._first.done():
            if fatal:
                self._first.set_exception(exc)  # __aenter__ raises it
            elif str(exc) != self._first_logged:
                # An unreachable broker is worth a warning; the same cause again is not news.
                self._first_logged = str(exc)
                log.warning("%s; retrying", exc)
            else:
                log.debug("%s; retrying", exc)
            return
        level = logging.ERROR if fatal else logging.WARNING
        log.log(level, "%s; retrying", exc, exc_info=not isinstance(exc, BrokerUnavailable))

    def _lost_error(self, client: Client) -> BrokerUnavailable:
        cause = None if client.lost.cancelled() else client.lost.exception()
        if cause is None:
            return BrokerUnavailable(f"the connection to {self.settings.address} ended")
        return broker_error(cause, self.settings)

    async def _serve(self, client: Client) -> BrokerUnavailable:
        """Subscribe, run on_connect, then carry the connection until it drops; return why."""
        assert self._tg is not None
        self.connection_count += 1
        self.session_present = client.session_present
        client.lost.add_done_callback(lambda _: self._mark_down(client))
        client.sink = self._offer
        pump = self._tg.create_task(self._pump(client), name=f"vox-mqtt in {client.identifier}")
        cause: BrokerUnavailable | None = None
        established = False
        try:
            self._setting_up = client
            try:
                await self._subscribe(client)
                if self._on_connect is not None:
                    await self._on_connect()
            except Exception:
                if client.lost.done():  # the failure is only a symptom of the drop
                    raise self._lost_error(client) from None
                raise
            finally:
                self._setting_up = None
            if client.lost.done():
                raise self._lost_error(client)
            self._link, established = client, True
            self._ready.set()
            if self._first is not None and not self._first.done():
                self._first.set_result(None)
            log.info(
                "connected to %s (session present: %s)",
                self.settings.address,
                client.session_present,
            )
            await asyncio.wait({client.lost})
            cause = self._lost_error(client)
            return cause
        finally:
            self._mark_down(client)
            pump.cancel()
            await asyncio.wait({pump})
            if self._abrupt:
                client.abort()
            else:
                await client.close()
            if established and self._on_disconnect is not None and not self._abrupt:
                try:
                    await self._on_disconnect(cause)
                except Exception:
                    log.exception("on_disconnect failed")

    def use_password(self, password: str) -> None:
        """Log in with this secret from the next connection on; the current one stays up."""
        self.settings = replace(self.settings, password=password)

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
                [(topic, SubscribeOptions(qos=1)) for topic in new],
                timeout=self.settings.connect_timeout,
            )
        except aiomqtt.MqttError as exc:
            log.warning("subscribing to %s: %s; the next connection subscribes", new, exc)
            return
        refused = [
            topic
            for topic, code in zip(new, codes, strict=False)
            if isinstance(code, ReasonCode) and code.is_failure
        ]
        if refused:
            self.subscriptions = tuple(t for t in self.subscriptions if t not in new)
            with contextlib.suppress(aiomqtt.MqttError):
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
            with contextlib.suppress(aiomqtt.MqttError):
                await client.unsubscribe(gone, timeout=self.settings.connect_timeout)

    async def _subscribe(self, client: Client) -> None:
        if not self.subscriptions:
            return
        codes = await client.subscribe(
            [(topic, SubscribeOptions(qos=1)) for topic in self.subscriptions],
            timeout=self.settings.connect_timeout,
        )
        for topic, code in zip(self.subscriptions, codes, strict=False):
            if isinstance(code, ReasonCode) and code.is_failure:
                raise SubscriptionRefused(
                    f"the broker refused client {client.identifier}'s subscription to {topic!r}: "
                    f"{code} (0x{code.value:02X}) — check the broker's ACL",
                    topic=topic,
                )

    def _offer(self, message: mqtt.MQTTMessage) -> bool:
        """Queue a message straight from paho's callback if there is room (Client.sink)."""
        if self._queue.full():
            return False
        self._queue.put_nowait(self._inbound(message.topic, message))
        return True

    async def _pump(self, client: Client) -> None:
        """Move the messages the sink had no room for into the session queue, then ack each."""
        with contextlib.suppress(aiomqtt.MqttError):
            async for message in client.messages:
                # A full queue blocks here and the PUBACK waits (see _RECEIVE_MAXIMUM).
                await self._queue.put(self._inbound(message.topic.value, message))
                client._client.ack(message.mid, message.qos)


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
