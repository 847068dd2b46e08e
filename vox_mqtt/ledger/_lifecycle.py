"""What a request's life reads back from the ledger: its rows, and the cancels remembered."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from vox_mqtt.ledger._schema import _ALL, _DOWNSTREAM
from vox_mqtt.ledger.actions import LedgerAction

__all__ = ["DOORS_OF", "RequestRows", "remembered_cancels", "request_rows", "untold_children"]

Read = Callable[[str, Iterable[Any]], Awaitable[list[dict[str, Any]]]]
# A request's own rows, the requests sent down for it, the cancels naming it.
RequestRows = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]
Fetch = Callable[[str, Iterable[Any]], Awaitable[Iterable[Any]]]

_OWN: Final = f"SELECT {_ALL} FROM logs WHERE message_id = ? ORDER BY id"
# The cancel_requests received, newest first: each names its request in details.request_id.
_CANCELS: Final = f"""SELECT json_extract(details, '$.request_id') AS request_id FROM logs
    WHERE message_type = 'cancel_request' AND action = '{LedgerAction.RECEIVED}'
    AND event_type = 'message'
    ORDER BY id DESC LIMIT ?"""
_CANCELS_OF: Final = f"""SELECT {_ALL} FROM logs WHERE message_type = 'cancel_request'
    AND action = '{LedgerAction.RECEIVED}' AND json_extract(details, '$.request_id') = ?
    ORDER BY id"""

# The operator's door rows (console/home/api.py, record_door) naming a request: which door
# (cli, web, mcp, a2a) its command, each cancel and each decision came through.
DOORS_OF: Final = f"""SELECT {_ALL} FROM logs
    WHERE action = '{LedgerAction.VIA}' AND event_type = 'door'
    AND json_extract(details, '$.request_id') = ? ORDER BY id"""


async def request_rows(read: Read, request_id: str) -> RequestRows:
    """Return a request's own rows, the requests sent down for it, the cancels naming it."""
    own = await read(_OWN, (request_id,))
    down = await read(_DOWNSTREAM, (request_id,))
    cancels = await read(_CANCELS_OF, (request_id,))
    return own, down, cancels


async def remembered_cancels(fetch: Fetch, limit: int) -> list[str]:
    """Return the request ids the newest `limit` cancel_requests received named."""
    return [str(r[0]) for r in await fetch(_CANCELS, (limit,)) if r[0]]


# Requests canceled here (`canceling`: the cancel passes down; `canceled`, in ledgers written
# before that row) whose downstream request's child was never sent its cancel (a crash
# between the two commits, docs/ledger.md) and never answered: (child, downstream).
_UNTOLD: Final = f"""SELECT d.target, d.message_id FROM logs AS c
    JOIN logs AS d ON d.reply_to = c.message_id AND d.action = '{LedgerAction.SENT}'
        AND d.message_type = 'command_request'
    WHERE c.action IN ('{LedgerAction.CANCELING}', '{LedgerAction.CANCELED}')
      AND c.message_type = 'command_request' AND c.id > ?
      AND NOT EXISTS (SELECT 1 FROM logs AS x WHERE x.message_type = 'cancel_request'
          AND x.action = '{LedgerAction.SENT}'
          AND json_extract(x.details, '$.request_id') = d.message_id)
      AND NOT EXISTS (SELECT 1 FROM logs AS a WHERE a.reply_to = d.message_id
          AND a.action = '{LedgerAction.RECEIVED}'
          AND a.message_type IN ('command_result', 'command_error'))
    ORDER BY c.id"""


async def untold_children(fetch: Fetch, since_row: int) -> list[tuple[str, str]]:
    """Return (child, downstream request) pairs a cancel never reached, after row since_row."""
    return [(str(r[0]), str(r[1])) for r in await fetch(_UNTOLD, (since_row,))]
