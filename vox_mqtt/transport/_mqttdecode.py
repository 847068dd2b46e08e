"""paho's PUBLISH and PUBACK decoding without its per-packet property objects.

paho unpacks every PUBLISH's properties into a fresh Properties object (about 150 us on the
development VM for the content type, expiry and three user properties each VOX message
carries: more than the rest of the packet) and builds a Properties and a ReasonCode for every
PUBACK. No agent reads either, so a PUBLISH's properties stay packed until someone asks
(RawProperties) and a PUBACK's reason code object is shared. QoS 0 and 2, MQTT 3.1.1 and
PUBACKs that carry properties keep paho's own code.
"""

from __future__ import annotations

import struct

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.exception import MalformedPacket, MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["RawProperties", "decode_lean", "split_publish"]


class RawProperties:
    """A received PUBLISH's v5 properties as packed (length first): decoded only on demand."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes) -> None:
        self.packed = packed

    def decode(self) -> Properties:
        """Return the properties as paho's object; MalformedPacket if they do not parse.

        paho's unpack raises whatever its parsing meets in bytes that are not properties
        (KeyError for an unknown identifier, struct.error for a value cut short,
        MQTTException for a property of another packet, UnicodeDecodeError): here they are
        one error, the one split_publish raises (tests/unit/test_mqtt_decode.py fuzzes it).
        """
        result = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        try:
            result.unpack(self.packed)  # type: ignore[no-untyped-call]
        except MalformedPacket:
            raise
        except (KeyError, IndexError, ValueError, struct.error, MQTTException) as exc:
            raise MalformedPacket(f"PUBLISH: unreadable properties ({exc!r})"[:200]) from None
        return result


def split_publish(packet: bytes | bytearray) -> tuple[bytes, int, bytes, bytes]:
    """Cut a QoS 1 MQTT v5 PUBLISH body into (topic, packet id, packed properties, payload)."""
    try:
        (topic_length,) = struct.unpack_from("!H", packet, 0)
        at = 2 + topic_length
        if at + 2 > len(packet):
            raise MalformedPacket("PUBLISH: the topic runs past the end of the packet")
        topic = bytes(packet[2:at])
        (mid,) = struct.unpack_from("!H", packet, at)
        at += 2
        start, length, shift = at, 0, 0
        while True:  # the property length: a variable byte integer of at most 4 bytes
            byte = packet[at]
            at += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 21:
                raise MalformedPacket("PUBLISH: a property length longer than 4 bytes")
    except (struct.error, IndexError):
        raise MalformedPacket("PUBLISH: the packet ends inside its header") from None
    end = at + length
    if end > len(packet):
        raise MalformedPacket("PUBLISH: the properties run past the end of the packet")
    return topic, mid, bytes(packet[start:end]), bytes(packet[end:])


# One ReasonCode per PUBACK code seen, shared: nothing modifies them.
_PUBACK_CODES: dict[int, ReasonCode] = {}
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
_NO_INFO = mqtt.MQTTMessageInfo(0)  # shared by every received message; nothing reads it


def puback_code(value: int) -> ReasonCode:
    """Return the shared ReasonCode of a PUBACK reason code value."""
    code = _PUBACK_CODES.get(value)
    if code is None:
        code = _PUBACK_CODES.setdefault(value, ReasonCode(PacketTypes.PUBACK, identifier=value))
    return code


def decode_lean(client: mqtt.Client) -> None:
    """Make one paho client decode QoS 1 PUBLISH and plain PUBACK packets the lean way."""
    handle_publish = client._handle_publish
    handle_pubackcomp = client._handle_pubackcomp

    def lean_publish() -> MQTTErrorCode:
        header = client._in_packet["command"]
        if (header & 0x06) >> 1 != 1 or client._protocol != mqtt.MQTTv5:
            return handle_publish()
        topic, mid, packed, payload = split_publish(client._in_packet["packet"])
        # Every slot set here, as MQTTMessage() would, but its `info`: that tracks a publish
        # of ours (and builds a threading.Condition), meaningless for one received.
        message = mqtt.MQTTMessage.__new__(mqtt.MQTTMessage)
        message.timestamp = mqtt.time_func()
        message.state = mqtt.mqtt_ms_invalid
        message.dup = bool(header & 0x08)
        message.mid = mid
        message._topic = topic
        message.payload = payload
        message.qos = 1
        message.retain = bool(header & 0x01)
        message.info = _NO_INFO
        message.properties = RawProperties(packed)  # type: ignore[assignment]
        client._handle_on_message(message)
        if client._manual_ack:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return client._send_puback(mid)

    def lean_pubackcomp(cmd: str) -> MQTTErrorCode:
        packet = client._in_packet["packet"]
        # A PUBACK without properties: the packet id, and maybe one reason code byte.
        if cmd != "PUBACK" or client._protocol != mqtt.MQTTv5 or len(packet) not in (2, 3):
            return handle_pubackcomp(cmd)  # type: ignore[arg-type]
        (mid,) = struct.unpack_from("!H", packet, 0)
        code = puback_code(packet[2] if len(packet) == 3 else 0)
        with client._out_message_mutex:
            if mid in client._out_messages:
                return client._do_on_publish(mid, code, _NO_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    client._handle_publish = lean_publish  # type: ignore[method-assign]
    client._handle_pubackcomp = lean_pubackcomp  # type: ignore[method-assign]
