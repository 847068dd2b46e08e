"""A command read back from the ledger at a restart, as the message it was (resume)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage

__all__ = ["downstream_from_row", "request_from_row"]

log = logging.getLogger("vox_mqtt.agent")

DEFAULT = "vox-mqtt"  # AgentConfig.message_source's default


def _origin(row: Mapping[str, Any]) -> str:
    """Return the message_source a resumed command carries: its origin's, as held."""
    held = row.get("origin_source")
    if isinstance(held, str) and held:
        return held
    stored = (row.get("details") or {}).get("message_source")
    if isinstance(stored, str) and stored and not stored.startswith(("hmac:", "sealed:")):
        return stored  # a ledger that keeps sources in clear
    # Received before the ledger held sources (an upgrade): the origin is unknown.
    log.warning("resuming %s without its origin's message_source", row.get("message_id"))
    return DEFAULT


def request_from_row(row: Mapping[str, Any]) -> VOXMessage | None:
    """Rebuild an acknowledged command_request from its ledger row."""
    details = row.get("details") or {}
    try:
        return VOXMessage(
            message_id=UUID(row["message_id"]),
            # The origin's, as the ledger held it sealed; never the row's digest (docs/ledger.md).
            message_source=_origin(row),
            emitted_at=row["emitted_at"],
            source=UUID(row["source"]),
            target=UUID(row["target"]),
            type=MSG_COMMAND_REQUEST,
            details={
                "command": details["command"],
                "params": details.get("params") or {},
                # Its deadline holds after a restart too: past it, it is never started.
                **({"deadline": details["deadline"]} if details.get("deadline") else {}),
            },
            reply_to=UUID(row["reply_to"]) if row.get("reply_to") else None,
        )
    except (KeyError, TypeError, ValueError):
        log.warning("cannot resume command from ledger row %r", row)
        return None


def downstream_from_row(
    row: Mapping[str, Any], request: VOXMessage, *, me: UUID
) -> tuple[UUID, VOXMessage]:
    """Rebuild the request sent down for a delegated command from its "sent" row."""
    child = UUID(str(row["target"]))
    return child, VOXMessage(
        message_id=UUID(str(row["message_id"])),
        message_source=request.message_source,
        emitted_at=row["emitted_at"],
        source=me,
        target=child,
        type=MSG_COMMAND_REQUEST,
        details=request.details,
        reply_to=request.message_id,
    )
