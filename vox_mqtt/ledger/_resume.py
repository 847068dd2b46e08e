"""What a restart reads back of a delegated command: the request it sent down for it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from vox_mqtt.ledger._schema import _ALL, _DOWNSTREAM, _INTERRUPTED
from vox_mqtt.ledger.actions import LedgerAction

__all__ = ["delegated_commands"]

Read = Callable[[str, Iterable[Any]], Awaitable[list[dict[str, Any]]]]
# Whether a command's cancel passed down here (its `canceling` row): its child's answer is
# then the confirmation it waits for (docs/ledger.md, "Canceled").
_CANCELING: Final = f"""SELECT {_ALL} FROM logs WHERE message_id = ?
    AND action = '{LedgerAction.CANCELING}' AND message_type = 'command_request' LIMIT 1"""


async def delegated_commands(read: Read) -> list[dict[str, Any]]:
    """Commands delegated, never started here, neither finished nor answered.

    Each row carries `downstream`: the row of the last request sent down for it, whose
    answer the command still waits for, and `canceling`: whether its master's cancel passed
    down already (a `canceling` row is no end: the child's answer still is).
    """
    rows = [r for r in await read(_INTERRUPTED, ()) if r["action"] == LedgerAction.DELEGATED]
    for row in rows:
        sent = await read(_DOWNSTREAM, (row["message_id"],))
        row["downstream"] = sent[-1] if sent else None
        row["canceling"] = bool(await read(_CANCELING, (row["message_id"],)))
    return rows
