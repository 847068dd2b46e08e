"""One MQTT v5 connection as an asyncio Protocol: our own framing over the `mqtt5` codec.

No MQTT library owns the socket or the loop: asyncio's transport reads and writes, this
module cuts packets and answers them (docs/transport.md, "The wire"). The packets of the
hot path are framed by transport/packets.py, from bytes the caller already holds: a PUBLISH
from its packed properties (transport/publishprops.py packs them once per kind), a PUBACK
from its packet id; a received PUBLISH keeps its properties packed until someone reads them
(RawProperties). Every other packet (CONNECT, CONNACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE,
DISCONNECT, PINGREQ) goes through `mqtt5`, used through its public API only (its contract:
tests/unit/test_wire_contract.py).

What the connection promises the session (transport/session.py):
- one write per turn of the loop for everything made ready in that turn (`_flush`);
- at most `PACKETS_PER_TURN` packets handled per turn of the loop: the rest of a burst
  waits for a later turn, so that timers and other tasks run (`_drain`);
- a PUBACK for a received QoS 1 message only once the session has it (`ack`), so the
  broker keeps what does not fit under our Receive Maximum; and no more QoS 1 publishes
  unanswered than the broker's (its CONNACK): the rest wait here, in order;
- closing ends within `CLOSE_BOUND`: the DISCONNECT if the socket takes it, then the
  socket is closed regardless (`close`).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import mqtt5

from vox_mqtt.protocol.messages import MAX_PACKET_BYTES
from vox_mqtt.protocol.settings import BrokerSettings, Will
from vox_mqtt.transport._mqttdecode import RawProperties, split_publish
from vox_mqtt.transport.outcome import CONNECTION_LOST, PublishOutcome, answered
from vox_mqtt.transport.packets import (
    MalformedPacket,
    frame_publish,
    puback,
    reason_name,
    reason_name_connack,
    split_packet,
)

__all__ = [
    "CLOSE_BOUND",
    "PACKETS_PER_TURN",
    "ConnectRefused",
    "Connection",
    "ConnectionLost",
    "Received",
    "Subscription",
    "connect",
]

# Packets one turn of the event loop handles before it lets other work run: a burst
# (thousands of retained messages) must not hold every task and timer until all is read
# (a starved look waited 19 s for a SUBACK that had come first).
PACKETS_PER_TURN: Final = 256
# How long closing waits for its DISCONNECT to leave before it closes the socket regardless
# (docs/transport.md, "Closing is bounded"): a frozen broker, or a socket whose sends block,
# must not hold a stopping process.
CLOSE_BOUND: Final = 0.25
# The topic of the end-of-retained marker (Session's mark_retained_end): no broker delivers
# a message on it, since no subscription of this package names a `$vox` topic.
RETAINED_END_TOPIC: Final = "$vox/retained-end"

_PUBLISH, _PUBACK = 0x30, 0x40
_PINGREQ = mqtt5.PingReqPacket().write()
_DISCONNECT = mqtt5.DisconnectPacket().write()


class ConnectRefused(Exception):
    """The broker answered the CONNECT with a failure reason code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (0x{code:02X})")
        self.code = code
        self.reason = reason


class ConnectionLost(Exception):
    """The connection ended: the broker's DISCONNECT, a keepalive without answer, a close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE."""

    topic: str
    qos: int = 1
    send_retained: bool = True  # False: retain handling 2, the broker sends none


@dataclass(frozen=True, slots=True)
class Received:
    """One PUBLISH as it came: properties still packed (Inbound's raw_properties)."""

    topic: str
    payload: bytes
    retain: bool
    qos: int
    mid: int
    properties: RawProperties | None  # None: a marker of ours (Session)


class Connection(asyncio.Protocol):
    """One MQTT v5 connection: packets in and out, publish outcomes, received messages."""

    def __init__(self, client_id: str, *, keepalive: int) -> None:
        self.identifier = client_id
        self.keepalive = keepalive
        self.session_present = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Takes a message straight from the read; False: no room, it waits in `waiting`.
        self.sink: Callable[[Received], bool] | None = None
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._inbox = bytearray()
        self._draining = False  # a later turn's _drain is scheduled
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._connack: asyncio.Future[mqtt5.ConnAckPacket] = self._loop.create_future()
        self._outcomes: dict[int, asyncio.Future[PublishOutcome]] = {}
        # QoS 1 publishes sent and not yet answered, at most the broker's Receive Maximum
        # (its CONNACK; MQTT v5 4.9): the rest wait in `_held`, in order.
        self._send_quota = 65535
        self._in_flight: set[int] = set()
        self._held: collections.deque[tuple[int, bytes]] = collections.deque()
        self._acks: dict[int, asyncio.Future[list[int]]] = {}  # SUBACK / UNSUBACK
        self._next_mid = 0
        self._waiting: collections.deque[Received | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._heard = True  # something came since the last keepalive tick
        self._ping_sent = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._closed_cause: BaseException | None = None

    @property
    def buffered(self) -> bytes:
        """Return what was read and not yet cut into packets (at most one packet's worth)."""
        return bytes(self._inbox)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (asyncio sets TCP_NODELAY on every TCP connection)."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        """Cut and handle the packets that arrived, at most PACKETS_PER_TURN this turn."""
        self._heard = True
        if self._closed_cause is not None:
            return  # a protocol error ended the connection: nothing more is read
        self._inbox += data
        if not self._draining:
            self._drain()

    def connection_lost(self, exc: Exception | None) -> None:
        """Report the end: to the CONNACK's waiter, the pending publishes, the session."""
        cause: BaseException | None = self._closed_cause or exc
        if cause is None:
            cause = ConnectionLost(0x80, "it dropped")
        if not self._connack.done():
            self._connack.set_exception(cause)
        self._lose(cause)

    # What the session calls

    def raw_socket(self) -> Any:
        """Return the connected socket (asyncio's view of it), or None once closing."""
        if self._transport is None or self._transport.is_closing():
            return None
        return self._transport.get_extra_info("socket")

    @property
    def unsent_bytes(self) -> int:
        """Return how many bytes wait to be written: this turn's and the transport's buffer."""
        buffered = self._transport.get_write_buffer_size() if self._transport is not None else 0
        return buffered + sum(len(data) for data in self._out)

    @property
    def send_quota(self) -> int:
        """Return the broker's Receive Maximum: QoS 1 publishes it takes unanswered."""
        return self._send_quota

    @property
    def backlog(self) -> int:
        """Return how many received messages wait for the session's queue (unacknowledged)."""
        return len(self._waiting)

    def publish_soon(
        self, topic: str, payload: bytes, qos: int, retain: bool, packed_properties: bytes
    ) -> asyncio.Future[PublishOutcome] | None:
        """Publish; return the future of its outcome (never an exception), None if the
        connection is gone already. At QoS 0 the future is resolved at once."""
        if self.lost.done():
            return None
        outcome: asyncio.Future[PublishOutcome] = self._loop.create_future()
        if qos == 0:
            self._send(frame_publish(topic, payload, 0, retain, 0, packed_properties))
            outcome.set_result(answered(0, "Success"))
            return outcome
        mid = self._mid()
        self._outcomes[mid] = outcome
        outcome.add_done_callback(lambda _: self._outcomes.pop(mid, None))
        packet = frame_publish(topic, payload, qos, retain, mid, packed_properties)
        if len(self._in_flight) < self._send_quota:
            self._in_flight.add(mid)
            self._send(packet)
        else:  # past the broker's Receive Maximum: sent as PUBACKs free the window
            self._held.append((mid, packet))
        return outcome

    async def publish_checked(
        self, topic: str, payload: bytes, qos: int, retain: bool, packed_properties: bytes
    ) -> PublishOutcome | None:
        """Publish and return what became of it; None if this connection is gone already."""
        outcome = self.publish_soon(topic, payload, qos, retain, packed_properties)
        return None if outcome is None else await outcome

    async def subscribe(self, filters: Sequence[Subscription], timeout: float) -> list[int]:
        """Subscribe; return the SUBACK's reason codes, one per filter (>= 0x80: refused)."""
        packet = [
            mqtt5.TopicFilter(
                f.topic,
                max_qos=mqtt5.QoS(f.qos),
                # The broker keeps a live message's retain flag off, as paho's default asked.
                retain_as_published=False,
                retain_handling=mqtt5.RetainHandling.SEND_ALWAYS
                if f.send_retained
                else mqtt5.RetainHandling.SEND_NEVER,
            )
            for f in filters
        ]
        return await self._acked(lambda mid: mqtt5.SubscribePacket(mid, packet).write(), timeout)

    async def unsubscribe(self, topics: Sequence[str], timeout: float) -> list[int]:
        """Unsubscribe; return the UNSUBACK's reason codes."""
        return await self._acked(
            lambda mid: mqtt5.UnsubscribePacket(mid, list(topics)).write(), timeout
        )

    async def messages(self) -> AsyncIterator[Received]:
        """Yield, in order, the received messages the sink had no room for; end with the link."""
        while True:
            while not self._waiting:
                if self.lost.done():
                    return
                self._waiter = self._loop.create_future()
                await asyncio.wait({self._waiter, self.lost}, return_when="FIRST_COMPLETED")
            item = self._waiting.popleft()
            if item is None:
                return
            yield item

    def mark(self, message: Received) -> None:
        """Put a message of our own (the end-of-retained marker) behind the received ones."""
        self._deliver(message)

    def ack(self, message: Received) -> None:
        """Send the PUBACK of a received QoS 1 message (the session has queued it)."""
        if message.qos == 1 and not self.lost.done():
            self._send(puback(message.mid))

    def disconnect_soon(self) -> None:
        """Send DISCONNECT (the broker discards the will); `lost` completes once it is sent."""
        if self.lost.done() or self._transport is None:
            return
        self._send(_DISCONNECT)
        self._flush()
        self._closed_cause = ConnectionLost(0x00, "closed by this client")
        self._transport.close()  # asyncio closes the socket once its buffer is written

    async def close(self, bound: float = CLOSE_BOUND) -> None:
        """Send DISCONNECT (the broker discards the will), then close the socket.

        The DISCONNECT gets at most `bound` seconds to leave; then the socket is closed
        regardless, as abort() does (the broker then sends the will): a DISCONNECT queued
        behind data a frozen broker no longer reads never leaves (docs/transport.md,
        "Closing is bounded").
        """
        if not self.lost.done() and self._transport is not None:
            self.disconnect_soon()
            await asyncio.wait({self.lost}, timeout=bound)
        self.abort()

    def abort(self) -> None:
        """Close the socket without DISCONNECT, as a crash would: the broker sends the will."""
        if self._transport is not None:
            self._transport.abort()
        self._lose(ConnectionLost(0x80, "closed by this client"))

    def fail_pending(self) -> None:
        """Resolve every pending publish as lost and fail every pending (un)subscribe."""
        for outcome in list(self._outcomes.values()):
            if not outcome.done():
                outcome.set_result(CONNECTION_LOST)
        for waiting in list(self._acks.values()):
            if not waiting.done():
                waiting.set_exception(ConnectionLost(0x80, "the connection dropped"))

    # Inside

    def _lose(self, cause: BaseException) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        if not self.lost.done():
            self.lost.set_exception(cause)
            self.lost.exception()  # retrieved: the session reads it when it wants
            self.fail_pending()
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def _mid(self) -> int:
        """Return a packet id no packet in flight or held uses (one space for all kinds)."""
        while True:
            self._next_mid = mid = self._next_mid % 65535 + 1
            if mid not in self._outcomes and mid not in self._in_flight and mid not in self._acks:
                return mid

    async def _acked(self, packet: Callable[[int], bytes], timeout: float) -> list[int]:
        if self.lost.done():
            raise ConnectionLost(0x80, "the connection dropped")
        mid = self._mid()
        waiting: asyncio.Future[list[int]] = self._loop.create_future()
        self._acks[mid] = waiting
        try:
            self._send(packet(mid))
            async with asyncio.timeout(timeout):
                return await waiting
        finally:
            self._acks.pop(mid, None)

    def _send(self, data: bytes) -> None:
        # Gathered and written once at the end of this turn: a system call and a TCP segment
        # for all of them rather than one per packet.
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and not self._transport.is_closing():
            data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
            self._transport.write(data)
        self._out.clear()

    def _drain(self) -> None:
        """Handle the packets in the inbox, at most PACKETS_PER_TURN; the rest on a later turn."""
        self._draining = False
        inbox = self._inbox
        handled = 0
        try:
            while inbox:
                if handled >= PACKETS_PER_TURN:
                    # What is left is handled on a later turn; stop reading meanwhile so the
                    # inbox does not grow without bound.
                    self._draining = True
                    if self._transport is not None:
                        self._transport.pause_reading()
                    self._loop.call_soon(self._drain_more)
                    return
                cut = split_packet(inbox)
                if cut is None:
                    return
                first, start, end = cut
                self._handle(first, inbox, start, end)
                del inbox[:end]
                handled += 1
        except (MalformedPacket, ValueError, IndexError) as exc:
            self._protocol_error(f"malformed packet: {exc}")
            inbox.clear()

    def _drain_more(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self._drain()

    def _handle(self, first: int, data: bytearray, start: int, end: int) -> None:
        kind = first & 0xF0
        if kind == _PUBLISH:
            self._received(first, bytes(data[start:end]))
        elif kind == _PUBACK and end - start in (2, 3):
            (mid,) = struct.unpack_from("!H", data, start)
            code = data[start + 2] if end - start == 3 else 0
            self._answered(mid, code)
        else:
            packet, _ = mqtt5.read(memoryview(data)[:end])
            self._control(packet)

    def _received(self, first: int, body: bytes) -> None:
        qos = (first >> 1) & 0x03
        if qos == 2:
            self._protocol_error("a QoS 2 PUBLISH, which no subscription of ours asks for")
            return
        topic, mid, packed, payload = split_publish(body, with_id=qos > 0)
        message = Received(
            topic=topic.decode(),
            payload=payload,
            retain=bool(first & 0x01),
            qos=qos,
            mid=mid,
            properties=RawProperties(packed),
        )
        self._deliver(message)

    def _deliver(self, message: Received) -> None:
        # The session's queue takes the message here if it has room and nothing waits
        # before it (the order is kept); its PUBACK goes out at once.
        if not self._waiting and self.sink is not None and self.sink(message):
            self.ack(message)
            return
        self._waiting.append(message)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _answered(self, mid: int, code: int) -> None:
        self._in_flight.discard(mid)
        while self._held and len(self._in_flight) < self._send_quota:
            held, packet = self._held.popleft()
            self._in_flight.add(held)
            self._send(packet)
        outcome = self._outcomes.get(mid)  # None when that publish already gave up waiting
        if outcome is not None and not outcome.done():
            outcome.set_result(answered(code, "Success" if code == 0 else reason_name(code)))

    def _control(self, packet: object) -> None:
        if isinstance(packet, mqtt5.ConnAckPacket):
            if not self._connack.done():
                self._connack.set_result(packet)
        elif isinstance(packet, mqtt5.PubAckPacket):  # a PUBACK with properties
            self._answered(packet.packet_id, int(packet.reason_code))
        elif isinstance(packet, mqtt5.SubAckPacket | mqtt5.UnsubAckPacket):
            waiting = self._acks.get(packet.packet_id)
            if waiting is not None and not waiting.done():
                waiting.set_result([int(code) for code in packet.reason_codes])
        elif isinstance(packet, mqtt5.PingRespPacket):
            self._ping_sent = False
        elif isinstance(packet, mqtt5.DisconnectPacket):
            code = int(packet.reason_code)
            self._closed_cause = ConnectionLost(code, packet.reason_str or reason_name(code))
            if self._transport is not None:
                self._transport.close()
        else:
            self._protocol_error(f"an unexpected {type(packet).__name__}")

    def _protocol_error(self, why: str) -> None:
        self._closed_cause = ConnectionLost(0x82, f"protocol error: {why}")
        if self._transport is not None:
            self._transport.abort()

    def _tick(self) -> None:
        """Once per keepalive: ping, or give up if the last ping got no answer at all."""
        if self.lost.done() or self._transport is None:
            return
        if self._ping_sent and not self._heard:
            self._closed_cause = ConnectionLost(0x8D, "no answer within the keepalive")
            self._transport.abort()
            return
        self._heard = False
        self._ping_sent = True
        self._send(_PINGREQ)
        self._keepalive = self._loop.call_later(self.keepalive, self._tick)

    async def handshake(self, connect: mqtt5.ConnectPacket) -> None:
        """Send CONNECT; return at a successful CONNACK, raise ConnectRefused otherwise."""
        self._send(connect.write())
        connack = await self._connack
        code = int(connack.reason_code)
        if code >= 0x80:
            self._closed_cause = ConnectRefused(code, reason_name_connack(code))
            self.abort()
            raise ConnectRefused(code, reason_name_connack(code))
        self.session_present = connack.session_present
        self._send_quota = connack.receive_max
        if connack.server_keep_alive is not None:  # the broker's keepalive overrides ours
            self.keepalive = connack.server_keep_alive
        if self.keepalive > 0:  # 0: no keepalive at all (MQTT v5, 3.1.2.10)
            self._keepalive = self._loop.call_later(self.keepalive, self._tick)


def connect_packet(
    s: BrokerSettings, *, will: Will | None, receive_maximum: int
) -> mqtt5.ConnectPacket:
    """Return the CONNECT of one attempt: clean start off, session expiry, the will."""
    will_packet = None
    if will is not None:
        will_packet = mqtt5.Will(
            will.topic,
            payload=will.payload,
            qos=mqtt5.QoS(will.qos),
            retain=will.retain,
            # JSON is UTF-8 text: the payload-format indicator says so to explorers.
            payload_format_indicator=1 if will.content_type == "application/json" else 0,
            message_expiry_interval=will.message_expiry,
            content_type=will.content_type,
            user_properties=list(will.user_properties),
        )
    return mqtt5.ConnectPacket(
        s.client_id,
        username=s.username,
        password=s.password.encode() if s.password is not None else None,
        # A persistent session needs clean start off on every connect (docs/transport.md).
        clean_start=False,
        will=will_packet,
        keep_alive=s.keepalive,
        session_expiry_interval=s.session_expiry,
        receive_max=receive_maximum,
        # The broker drops for this client what it could not read (MQTT v5 3.1.2.11.4),
        # and split_packet refuses a larger packet before its bytes arrive.
        max_packet_size=MAX_PACKET_BYTES,
    )


async def connect(
    s: BrokerSettings,
    *,
    will: Will | None,
    tls: ssl.SSLContext | None,
    receive_maximum: int,
) -> Connection:
    """Open one connection as s describes it and return it once the CONNACK accepted it.

    Raises OSError / ssl.SSLError (unreachable, TLS), TimeoutError (no CONNACK within the
    connect timeout), ConnectRefused, or ConnectionLost (closed before the CONNACK).
    """
    loop = asyncio.get_running_loop()
    connection: Connection | None = None

    def made() -> Connection:
        nonlocal connection
        connection = Connection(s.client_id, keepalive=s.keepalive)
        return connection

    try:
        async with asyncio.timeout(s.connect_timeout):
            await loop.create_connection(
                made, s.host, s.port, ssl=tls, server_hostname=s.host if tls else None
            )
            assert connection is not None
            await connection.handshake(
                connect_packet(s, will=will, receive_maximum=receive_maximum)
            )
    except BaseException:
        if connection is not None:
            connection.abort()
        raise
    return connection
