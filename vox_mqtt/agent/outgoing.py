"""A message checked and serialized for sending, its record still to commit (Outbox.prepare)."""

from __future__ import annotations

from dataclasses import dataclass

from vox_mqtt.protocol.messages import VOXMessage

__all__ = ["Outgoing"]


@dataclass(frozen=True, kw_only=True)
class Outgoing:
    """A message checked and serialized for sending, its record still to commit (prepare)."""

    message: VOXMessage
    expects_reply: bool
    topic: str
    payload: bytes
    # An answer to a received command_request: published once, never re-sent nor
    # acknowledged, held for replay until then (a Unix time; docs/messages.md).
    replay_until: float | None = None

    @property
    def outbox(self) -> tuple[str, bytes]:
        """Return what its "sent" row keeps: (topic, payload), for the outbox or for replay."""
        return self.topic, self.payload
