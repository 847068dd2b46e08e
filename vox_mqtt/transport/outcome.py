"""What became of one QoS 1 publish, in the transport's own words (docs/transport.md).

A publish ends one of three ways: the broker accepted it (a PUBACK with a success code:
0x00, or 0x10 when nobody is subscribed), the broker refused it (a PUBACK code >= 0x80: the
ACL, a quota, a malformed packet), or the connection was lost before any PUBACK came, and
it may or may not have been delivered. `Session.publish_soon`'s future resolves to a
`PublishOutcome` in every one of those cases and never raises, so the agent's outbox decides
on a value of ours (docs/architecture.md, "the outbox") and no type of the MQTT library
crosses `vox_mqtt/transport/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vox_mqtt.protocol.errors import DeliveryFailed

# The lowest PUBACK reason code that means a refusal (MQTT v5, 3.4.2.1).
REFUSED_FROM: Final = 0x80
NOT_AUTHORIZED: Final = 0x87


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """The broker's answer to one publish, or the loss of the connection before it."""

    code: int | None  # the PUBACK reason code; None when the connection was lost first
    reason: str  # the code's name ("Success", "Not authorized") or why it was lost

    @property
    def accepted(self) -> bool:
        """The broker took the message (it may have had no subscriber)."""
        return self.code is not None and self.code < REFUSED_FROM

    @property
    def refused(self) -> bool:
        """The broker answered and refused it: sending it again cannot help."""
        return self.code is not None and self.code >= REFUSED_FROM

    @property
    def lost(self) -> bool:
        """The connection ended before the broker answered: a re-send on the next one may."""
        return self.code is None

    def error(self, topic: str) -> DeliveryFailed:
        """Return the error for an outcome that is not accepted, in words a person can act on."""
        if self.code is None:
            return DeliveryFailed(f"not confirmed on {topic!r}: {self.reason}")
        hint = " — the broker's ACL does not let this client publish there"
        return DeliveryFailed(
            f"the broker refused the message on {topic!r}: {self.reason} (0x{self.code:02X})"
            + (hint if self.code == NOT_AUTHORIZED else ""),
            reason_code=self.code,
        )


# Why a pending publish is lost when its connection drops.
CONNECTION_LOST = PublishOutcome(
    None,
    "the connection dropped before the broker acknowledged the message "
    "(it may or may not have been delivered)",
)

_ANSWERS: dict[tuple[int, str], PublishOutcome] = {}


def answered(code: int, reason: str) -> PublishOutcome:
    """Return the outcome of a PUBACK (one shared value per code: this is the hot path)."""
    key = (code, reason)
    outcome = _ANSWERS.get(key)
    if outcome is None:
        outcome = _ANSWERS[key] = PublishOutcome(code, reason)
    return outcome
