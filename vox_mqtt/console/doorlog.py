"""Which door each of the operator's acts came through, in its ledger (docs/operations.md).

Every door is audited: a command, a cancel and a decision sent through the console's API
(`vox` verbs: cli), the web console (web), `vox mcp` (mcp) or the A2A door (a2a) leaves one
row beside the message's own rows, event `door`, action `via`, details `{"request_id",
"door", "what": "command" | "cancel" | "decision", ...}`. The message itself is signed as
is and stays the same whatever door sent it. `vox request show`, the console's
`/v1/request` and the web console's request API read them back (`request_doors`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, Literal
from uuid import UUID

if TYPE_CHECKING:
    from vox_mqtt.console.operator import OperatorConsole
    from vox_mqtt.ledger.store import VOXAgentMemory

__all__ = ["DOORS", "WHATS", "door_details", "door_summary", "record_door", "request_doors"]

DOORS: Final = ("cli", "web", "mcp", "a2a")  # what an act may come through
WHATS: Final = ("command", "cancel", "decision")  # what came through it
What = Literal["command", "cancel", "decision"]


def door_details(request_id: UUID, door: str, what: What, **extra: str | None) -> dict[str, Any]:
    """Return a door row's details: the request (or decision) it names, the door, what came."""
    if door not in DOORS:
        raise ValueError(f"door is one of {', '.join(DOORS)}, not {door!r}")
    details: dict[str, Any] = {"request_id": str(request_id), "door": door, "what": what}
    details.update({k: v for k, v in extra.items() if v is not None})
    return details


def door_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Return what the views show of a request's door rows, oldest first.

    `door`: the door its command (or decision) came through, None when none was recorded
    (sent before doors were audited, or by a program of its own); `doors`: every act, as
    `{"door", "what", "at"}` (a row from before `what` was recorded is its command).
    """
    acts = []
    for row in rows:
        details = row.get("details")
        if isinstance(details, str):  # a row as sqlite3 gives it; the ledger's reads parse it
            try:
                details = json.loads(details)
            except ValueError:
                continue
        if not isinstance(details, dict):
            continue
        door = details.get("door")
        if door not in DOORS:
            continue
        what = details.get("what") if details.get("what") in WHATS else "command"
        acts.append({"door": door, "what": what, "at": row.get("recorded_at")})
    first = next((a["door"] for a in acts if a["what"] != "cancel"), None)
    return {"door": first, "doors": acts}


async def request_doors(memory: VOXAgentMemory, request_id: UUID) -> dict[str, Any]:
    """Return `door_summary` of a request's door rows in this ledger."""
    return door_summary(await memory.doors(request_id))


async def record_door(
    console: OperatorConsole,
    request_id: UUID,
    command: str | None,
    door: str,
    what: What = "command",
    **extra: str | None,
) -> None:
    """Note in the operator's ledger which door a command, cancel or decision came through.

    One row of its own (event "door", action "via"), beside the message's own rows: the
    message is signed as is and stays the same whatever door sent it.
    """
    from vox_mqtt.ledger.actions import LedgerAction  # loaded with the ledger it writes to

    details = door_details(request_id, door, what, command=command, **extra)
    op = console.file.operator
    await console.agent.ledger.record("door", LedgerAction.VIA, op.id, op.root_id, details)
