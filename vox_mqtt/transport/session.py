"""The MQTT v5 session of one identity: persistent, reconnecting, with an honest publish outcome."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from uuid import UUID

from vox_mqtt.protocol.errors import BrokerUnavailable, DeliveryFailed, Refused
from vox_mqtt.protocol.settings import BrokerSettings, Will
from vox_mqtt.protocol.signing import RETIRED_KEY, SignedTopic, Signing, carry_over
from vox_mqtt.protocol.storm import backoff_window
from vox_mqtt.transport.failures import broker_error, tls_context
from vox_mqtt.transport.inbound import Inbound, carried
from vox_mqtt.transport.outcome import PublishOutcome
from vox_mqtt.transport.publishprops import PackedProperties, packed_bytes, publish_properties
from vox_mqtt.transport.signing import judge, own_key_renewed, signed_properties, signed_will
from vox_mqtt.transport.subscriptions import Subscribing
from vox_mqtt.transport.wire import (
    RETAINED_END_TOPIC,
    Connection,
    ConnectRefused,
    Received,
    connect,
)

__all__ = ["BrokerSettings", "Inbound", "PublishOutcome", "Session", "Will"]

log = logging.getLogger(__name__)

# MQTT v5 Receive Maximum: unacknowledged messages the broker may push at once. We send the
# PUBACK only once a message is in the session queue, so a slow consumer makes the broker keep
# the rest in the persistent session instead of this process buffering without bound.
_RECEIVE_MAXIMUM = 100
_STABLE = 10.0  # seconds a connection must last before the reconnect backoff starts over
# What messages() finds in its queue where the end-of-retained marker went (never yielded).
_RETAINED_END = Inbound(topic=RETAINED_END_TOPIC, payload=b"", retain=False)
# Messages messages() hands out in a row before it lets the event loop run other work.
_YIELD_EVERY = 256


class Session(Subscribing):
    """One identity's MQTT session, kept alive across broker restarts and network cuts.

    Persistent (clean_start False on every connect, session expiry): messages published to
    its subscriptions while it is away are delivered when it is back. A PUBACK only means
    "queued in the peer's memory" (this session acks inbound QoS 1 once the message is in
    its queue, before any reader takes it); making a message durable is the VOX
    acknowledgement's job (docs/transport.md).
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
        mark_retained_end: bool = False,
        retry: bool = True,
        acknowledge: bool = True,
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
        # A one-shot (retry=False: the canary, the dynsec control, a login check) makes one
        # attempt: its failure ends `async with` at once, and a drop ends the session.
        self._retry = retry
        self._ended = False  # a one-shot's connection is over
        # acknowledge=False: a login check that takes nothing from the session (Receive
        # Maximum 1, no PUBACK: what the broker holds stays queued for the identity's owner).
        self._acknowledge = acknowledge
        # A look subscribes at QoS 0 and each connection's retained messages end with a
        # marker (caught_up): a QoS 1 message past the in-flight window waits in the broker's
        # queue, and the marker's SUBACK would overtake it. The marker's subscription turns
        # them to QoS 1, so that what comes live is paced by the Receive Maximum again.
        self._marks_end = mark_retained_end
        self._caught_up = asyncio.Event()
        self._queue: asyncio.Queue[Inbound | None] = asyncio.Queue(max(1, max_queued))
        self._link: Connection | None = None  # the connection that is up and set up
        self._setting_up: Connection | None = None  # the one on_connect is running on
        self._ready = asyncio.Event()
        self._closing = self._abrupt = False
        self._tls: ssl.SSLContext | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._last_error: BrokerUnavailable | None = None
        self._first_logged = ""  # the last cause logged while the first connect is retried
        self._spare_will: tuple[Will | None] | None = None  # made, never sent; unsigned
        self.forged = 0  # messages delivered with a forgery verdict
        self.unsigned = 0  # unsigned messages let through in "accept" mode
        self.on_unsigned: Callable[[], None] | None = None  # told of each (the agent counts)
        self.on_forgery: Callable[[str, str], None] | None = None  # (topic, problem)
        # Senders whose refused UNKNOWN_KEY message verifies after a reload (carry_over).
        self.on_rotation_explained: Callable[[set[UUID]], None] | None = None

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
                while self._link is None and not (self._closing or self._ended):
                    await self._ready.wait()
        except TimeoutError:
            pass
        if self._link is None:
            raise self._unreachable(timeout)

    async def caught_up(self, timeout: float) -> bool:
        """Return whether, within timeout seconds, messages() has handed out every retained
        message the latest connection's subscriptions brought (with mark_retained_end)."""
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
        except TimeoutError:
            return False
        return True

    async def messages(self) -> AsyncIterator[Inbound]:
        """Yield inbound messages, across reconnects, until the session ends."""
        handed = 0
        while not (self._closing and self._queue.empty()):
            handed += 1
            if handed % _YIELD_EVERY == 0:
                # get() does not wait while the queue holds messages: let the loop's other
                # work (reads, timers, the reader's own tasks) have a turn in a burst.
                await asyncio.sleep(0)
            item = await self._queue.get()
            if item is None:
                self._queue.put_nowait(None)  # let any other reader stop too
                return
            if item is _RETAINED_END:
                # The reader asks for the next message only once it has taken the last one.
                self._caught_up.set()
                continue
            yield item

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        expiry: int | None = None,
        content_type: str | None = "application/json",
        props: PackedProperties | None = None,
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
        props = self._signed(topic, payload, props)
        timeout = self.settings.publish_timeout
        outcome: PublishOutcome | None = None
        sent = False
        try:
            async with asyncio.timeout(timeout):
                while outcome is None:  # None: that connection is gone, wait for the next one
                    client = await self._live_client()
                    sent = True
                    outcome = await client.publish_checked(
                        topic, payload, qos, retain, packed_bytes(props)
                    )
                    sent = False
        except TimeoutError:
            if sent:
                raise DeliveryFailed(
                    f"the broker did not acknowledge the message on {topic!r} within {timeout:g}s"
                ) from None
            raise DeliveryFailed(f"not sent to {topic!r}: {self._unreachable(timeout)}") from None
        if not outcome.accepted:
            raise outcome.error(topic)

    def publish_soon(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        content_type: str | None = "application/json",
        props: PackedProperties | None = None,
    ) -> asyncio.Future[PublishOutcome] | None:
        """Publish at QoS 1 on the live connection only; return the future of its outcome
        (accepted, refused, or lost if that connection drops first: never an exception), or
        None with no connection up.

        During on_connect that is the connection being set up: the outbox re-sends what it
        holds from there, at once (docs/architecture.md, the outbox)."""
        client = self._usable()
        if self._closing or client is None:
            return None
        if props is None:
            props = publish_properties(content_type, None)
        signed = self._signed(topic, payload, props)
        return client.publish_soon(topic, payload, 1, retain, packed_bytes(signed))

    def use_signing(self, signing: Signing | None) -> bool:
        """Sign and verify with these keys from now on (a rotation picked up on SIGHUP).

        A new own key reconnects once, cleanly (the broker discards the old will), so that
        the will is registered signed with it (docs/security.md); return whether it does.
        Disconnected, nothing reconnects: the next CONNECT's will is signed with it.
        """
        renewed = own_key_renewed(self.settings.signing, signing)
        if self.settings.signing is not None and signing is not None:
            explained = carry_over(self.settings.signing.keyring, signing.keyring)
            for sender in sorted(explained):
                log.warning(
                    "%s: the message of %s refused UNKNOWN_KEY before this reload verifies"
                    " under its new key: its rotation was reloaded before this agent, not a"
                    " forgery (docs/security.md, rotation)",
                    self.settings.client_id,
                    sender,
                )
            if explained and self.on_rotation_explained is not None:
                self.on_rotation_explained(explained)
        self.settings = replace(self.settings, signing=signing)
        if not renewed or self._will is None or self._link is None:
            return False
        log.info("%s: a new signing key: reconnecting once for its will", self.settings.client_id)
        self._link.disconnect_soon()
        return True

    def _signed(self, topic: str, payload: bytes, props: PackedProperties) -> PackedProperties:
        return signed_properties(self.settings.signing, topic, payload, props)

    def _inbound(self, message: Received) -> Inbound:
        """Wrap a received message with the verdict on its signature (docs/security.md);
        the end-of-retained marker becomes the one _RETAINED_END messages() looks for."""
        topic = message.topic
        if topic == RETAINED_END_TOPIC:
            return _RETAINED_END
        payload = message.payload
        retain = message.retain
        signing = self.settings.signing
        props = carried(message.properties)
        if signing is None or signing.mode == "off":
            return Inbound(topic=topic, payload=payload, retain=retain, wire_properties=props)
        verdict = judge(signing, topic, payload, props)
        if verdict.unsigned:
            self.unsigned += 1
            if self.on_unsigned is not None:
                self.on_unsigned()
        if verdict.forgery is not None:
            self.forged += 1
            # A retained copy signed with a retired key is what the broker kept from before a
            # rotation, until its agent's birth under the new key replaces it: refused all the
            # same, but no sign of forgery (docs/security.md, rotation).
            kept = retain and verdict.forgery.startswith(RETIRED_KEY)
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
        return Inbound(  # built once, with its verdict (dataclasses.replace costs as much again)
            topic=topic,
            payload=payload,
            retain=retain,
            wire_properties=props,
            signature=verdict.signature,
            forgery=verdict.forgery,
            digest=verdict.digest,
        )

    def _unreachable(self, timeout: float | None) -> BrokerUnavailable:
        if self._closing or self._ended:
            return BrokerUnavailable(f"the MQTT session of {self.settings.client_id} is closed")
        waited = f" within {timeout:g}s" if timeout is not None else ""
        last = f": {self._last_error}" if self._last_error is not None else ""
        return BrokerUnavailable(f"not connected to {self.settings.address}{waited}{last}")

    def _usable(self) -> Connection | None:
        """Return the live connection or, while on_connect runs, the one being set up (on_connect's
        own publishes, the birth and the outbox's re-sends, go out on it); None without one."""
        for client in (self._link, self._setting_up):
            if client is not None and not client.lost.done():
                return client
        return None

    async def _live_client(self) -> Connection:
        """Return the connection to publish on, waiting for one while there is none."""
        while True:
            if self._closing or self._ended:
                raise DeliveryFailed(f"the MQTT session of {self.settings.client_id} is closed")
            if (client := self._usable()) is not None:
                return client
            if self._link is not None:
                self._mark_down(self._link)
            await self._ready.wait()

    def _mark_down(self, client: Connection) -> None:
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

    def _next_will(self) -> Will | None:
        """Return the will of one attempt as made, before it is signed."""
        if self._spare_will is not None:  # the last attempt never sent its CONNECT
            (will,), self._spare_will = self._spare_will, None
            return will
        return self._will() if self._will is not None else None

    async def _open(self) -> Connection:
        """Make one connection attempt; raise BrokerUnavailable saying why it failed.

        A stop during the attempt cancels it at once, whatever the broker does (a frozen
        broker accepts the TCP connection and never sends its CONNACK): the connection it
        opened is closed (docs/transport.md, "Closing is bounded").
        """
        s = self.settings
        will = self._next_will()
        # Signed per attempt with the key of now: a key rotated while no CONNECT went out
        # (an outage) signs the will kept from before it (docs/security.md, rotation).
        signed = signed_will(s.signing, will)
        try:
            # A login check takes nothing: one message in flight, never acknowledged.
            receive = _RECEIVE_MAXIMUM if self._acknowledge else 1
            return await connect(s, will=signed, tls=self._tls, receive_maximum=receive)
        except (ConnectRefused, ConnectionRefusedError) as exc:
            # The broker refused the CONNECT (e.g. a secret re-keyed before this agent was
            # told), or no CONNECT went out: the will was never registered, so keep it and
            # its epoch.
            self._spare_will = (will,)
            raise broker_error(exc, s) from None
        except Exception as exc:
            raise broker_error(exc, s) from None

    async def _run(self) -> None:
        """Connect, carry the connection until it drops, back off (protocol/storm.py), repeat."""
        failures = 0
        while True:
            started = asyncio.get_running_loop().time()
            try:
                cause = await self._serve(await self._open())
            except BrokerUnavailable as exc:  # includes a drop while setting up
                self._failed(exc, fatal=isinstance(exc, Refused) or not self._retry)
            except Exception as exc:  # on_connect failed, e.g. the birth was refused
                self._failed(exc, fatal=True)
            else:
                # Only a connection that lasted starts the backoff over: two processes with one
                # identity (the broker drops the older) must not take turns at full speed.
                if asyncio.get_running_loop().time() - started >= _STABLE:
                    failures = 0
                self._last_error = cause
                if self._retry:
                    log.warning("%s; reconnecting", cause)
            if not self._retry:
                self._end()
                return
            s, failures = self.settings, failures + 1
            self.reconnect_window = backoff_window(s.reconnect_min, failures - 1, s.reconnect_max)
            await asyncio.sleep(random.uniform(0, self.reconnect_window))

    def _end(self) -> None:
        """End a one-shot session whose one attempt is over: wake whoever waits on it."""
        self._ended = True
        self._ready.set()
        if not self._queue.full():
            self._queue.put_nowait(None)

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
        then = "; retrying" if self._retry else ""
        log.log(level, "%s%s", exc, then, exc_info=not isinstance(exc, BrokerUnavailable))

    def _lost_error(self, client: Connection) -> BrokerUnavailable:
        cause = None if client.lost.cancelled() else client.lost.exception()
        if cause is None:
            return BrokerUnavailable(f"the connection to {self.settings.address} ended")
        return broker_error(cause, self.settings)

    async def _serve(self, client: Connection) -> BrokerUnavailable:
        """Subscribe, run on_connect, then carry the connection until it drops; return why."""
        assert self._tg is not None
        self.connection_count += 1
        self.session_present = client.session_present
        client.lost.add_done_callback(lambda _: self._mark_down(client))
        pump: asyncio.Task[None] | None = None
        if self._acknowledge:
            client.sink = self._offer
            pump = self._tg.create_task(self._pump(client), name=f"vox-mqtt in {client.identifier}")
        # else: a message left in the client's own queue is never acknowledged (a login check)
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
            if pump is not None:
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

    def _offer(self, message: Received) -> bool:
        """Queue a message straight from the connection's read if there is room (its sink)."""
        if self._queue.full():
            return False
        self._queue.put_nowait(self._inbound(message))
        return True

    async def _pump(self, client: Connection) -> None:
        """Move the messages the sink had no room for into the session queue, then ack each."""
        async for message in client.messages():
            # A full queue blocks here and the PUBACK waits (see _RECEIVE_MAXIMUM).
            await self._queue.put(self._inbound(message))
            client.ack(message)
