"""The small, flat set of exceptions vox-mqtt raises; nothing lower-level leaks out."""

from __future__ import annotations

from uuid import UUID

__all__ = [
    "BrokerUnavailable",
    "CommandFailed",
    "ConfigError",
    "DeliveryFailed",
    "FleetError",
    "InvalidMessage",
    "InvalidParams",
    "LedgerError",
    "MessageTooLarge",
    "Refused",
    "SubscriptionRefused",
    "TopicError",
    "VoxError",
]


class VoxError(Exception):
    """Base class of every error vox-mqtt raises on purpose."""


class InvalidMessage(VoxError):
    """Bytes that are not a valid VOX message, with the reason a person can act on."""

    def __init__(
        self,
        reason: str,
        *,
        message_id: UUID | None = None,
        source: UUID | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        # Best-effort identity of the offending message, so the receiver can
        # answer the sender with command_error INVALID_MESSAGE.
        self.message_id = message_id
        self.source = source


class InvalidParams(VoxError):
    """A command's params do not fit it: the operator's mistake, answered INVALID_PARAMS.

    Raised before a handler runs when the params do not fit its signature, and by a handler
    that finds them wrong together (an end before a start): never a fault of the agent,
    so it is logged as one line, never with a traceback (docs/messages.md, error codes).
    The message names the command and the parameter, never the role that serves it.
    """


class _ProblemList(VoxError):
    """An error that carries one readable line per problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class FleetError(_ProblemList):
    """The fleet file is unreadable or describes an invalid tree."""


class ConfigError(_ProblemList):
    """A daemon or console config file is unreadable or invalid."""


class TopicError(VoxError):
    """A topic string that is not part of the VOX topic scheme."""


class BrokerUnavailable(VoxError):
    """The broker cannot be reached, refused the credentials or dropped the session."""


class Refused(BrokerUnavailable):
    """The broker or the TLS layer said no in a way that retrying will not change."""


class SubscriptionRefused(Refused):
    """The broker refused one of the session's subscriptions (its ACL does not allow it)."""

    def __init__(self, reason: str, *, topic: str) -> None:
        super().__init__(reason)
        self.topic = topic


class DeliveryFailed(VoxError):
    """The broker refused a publish (PUBACK reason code >= 0x80) or it could not be sent."""

    def __init__(self, reason: str, *, reason_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason_code = reason_code


class MessageTooLarge(VoxError):
    """A message to send is over the size limit: publishing it would cost the connection."""

    def __init__(self, reason: str, *, size: int, limit: int) -> None:
        super().__init__(reason)
        self.size = size
        self.limit = limit


class CommandFailed(VoxError):
    """A command came back as command_error."""

    def __init__(self, code: str, error: str) -> None:
        super().__init__(f"{code}: {error}")
        self.code = code
        self.error = error


class LedgerError(VoxError):
    """The ledger refused a write or failed verification."""
