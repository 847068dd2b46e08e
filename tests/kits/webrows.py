"""Rows the web console's unit tests feed it: a war-room post, the operator's ledger rows.

Shared by tests/unit/test_web_state.py and tests/unit/test_web_truth.py.
"""

from __future__ import annotations

from uuid import UUID, uuid4

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import new_message, serialize
from vox_mqtt.transport.session import Inbound

ME, ROOT = str(uuid4()), str(uuid4())  # the operator and its root, in ledger rows


def post(source: UUID, subject: UUID, *, resolved: bool = False, description: str = "x") -> Inbound:
    """A retained war-room post of source's about subject (VM_CONNECTION_LOST)."""
    failure = SystemFailure(
        error_code="VM_CONNECTION_LOST",
        severity="CRITICAL",
        description=description,
        resolved=resolved,
    )
    message = new_message(
        MSG_SYSTEM_FAILURE, source=source, target=topics.WARROOM_ID, details=failure
    )
    return Inbound(topic=topics.warroom(source, subject), payload=serialize(message), retain=True)


def ledger_row(n: int, action: str, kind: str | None, **fields: object) -> dict[str, object]:
    """The operator's ledger row number n, from the root to the operator unless told."""
    row: dict[str, object] = {
        "id": n,
        "recorded_at": f"2026-01-01T00:00:{n:02d}+00:00",
        "action": action,
        "message_type": kind,
        "message_id": str(uuid4()),
        "source": ROOT,
        "target": ME,
        "reply_to": None,
        "reason": None,
        "details": {},
    }
    row.update(fields)
    return row


def sent(n: int, command: str, **details: object) -> dict[str, object]:
    """The row of a command the operator sent to the root."""
    return ledger_row(
        n,
        "sent",
        "command_request",
        source=ME,
        target=ROOT,
        details={"command": command, "params": {"x": 1}, **details},
    )
