"""The acknowledgement of a received message, built without validating it all again.

Every field of a message_acknowledged is a fresh id and time, a constant, or taken from the
validated message it answers. `VOXMessage.acknowledgement` builds it through pydantic, which
checks them all again, and its payload twice (built, dumped, validated with the envelope,
validated again as the payload). The inbound pipeline acknowledges every message it
receives, so it builds it here instead (docs/performance.md): the same message, field for
field, payload and serialization (tests/unit/test_messages.py).
"""

from __future__ import annotations

from vox_mqtt.protocol._jsonvalue import FrozenDict
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MessageAcknowledged,
    VOXMessage,
    _new_id,
    now_iso,
)

__all__ = ["acknowledge"]


def acknowledge(message: VOXMessage, *, message_source: str | None = None) -> VOXMessage:
    """Return the message_acknowledged for a validated message."""
    source = message.message_source if message_source is None else message_source
    if not isinstance(source, str) or not source:
        # Only a bad message_source can fail: let validation say why.
        return message.acknowledgement(message_source=message_source)
    ack = VOXMessage.model_construct(
        message_id=_new_id(),
        message_source=source,
        emitted_at=now_iso(),
        source=message.target,
        target=message.source,
        type=MSG_ACKNOWLEDGED,
        details=FrozenDict(in_response_to=str(message.message_id)),
        reply_to=message.message_id,
    )
    cache = ack.__pydantic_private__
    assert cache is not None
    cache["_payload"] = MessageAcknowledged.model_construct(in_response_to=message.message_id)
    return ack
