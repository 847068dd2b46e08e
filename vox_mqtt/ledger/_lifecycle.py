"""What a request's life reads back from the ledger: its rows, and the cancels remembered."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from vox_mqtt.ledger._schema import _ALL, _DOWNSTREAM

__all__ = ["remembered_cancels", "request_rows"]

Read = Callable[[str, Iterable[Any]], Awaitable[list[dict[str, Any]]]]
Fetch = Callable[[str, Iterable[Any]], Awaitable[Iterable[Any]]]

_OWN: Final = f"SELECT {_ALL} FROM logs WHERE message_id = ? ORDER BY id"
# The cancel_requests received, newest first: each names its request in details.request_id.
_CANCELS: Final = """SELECT json_extract(details, '$.request_id') AS request_id FROM logs
    WHERE message_type = 'cancel_request' AND action = 'received' AND event_type = 'message'
    ORDER BY id DESC LIMIT ?"""
_CANCELS_OF: Final = f"""SELECT {_ALL} FROM logs WHERE message_type = 'cancel_request'
    AND action = 'received' AND json_extract(details, '$.request_id') = ? ORDER BY id"""


async def request_rows(
    read: Read, request_id: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Return a request's own rows, the requests sent down for it, the cancels naming it."""
    own = await read(_OWN, (request_id,))
    down = await read(_DOWNSTREAM, (request_id,))
    cancels = await read(_CANCELS_OF, (request_id,))
    return own, down, cancels


async def remembered_cancels(fetch: Fetch, limit: int) -> list[str]:
    """Return the request ids the newest `limit` cancel_requests received named."""
    return [str(r[0]) for r in await fetch(_CANCELS, (limit,)) if r[0]]
