"""Running one command handler: its timeout, and each way it can end as an answer."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import UUID

from pydantic_core import PydanticSerializationError, to_jsonable_python

from vox_mqtt.agent.roles import Handler
from vox_mqtt.protocol.errors import InvalidParams
from vox_mqtt.protocol.messages import CommandError, CommandResult, ErrorCode

__all__ = ["call_handler"]

log = logging.getLogger("vox_mqtt.agent")


async def call_handler(
    handler: Handler,
    name: str,
    params: dict[str, Any],
    timeout: float,
    *,
    agent: str,
    handled_by: UUID,
) -> CommandResult | CommandError:
    """Run a command's handler within its timeout; every way it can end becomes an answer."""
    try:
        async with asyncio.timeout(timeout):
            result = await handler(**params)
        result = to_jsonable_python(result)
    except InvalidParams as exc:
        # The operator's mistake, not a fault here: one line, no traceback (docs/messages.md).
        log.info("%s: command %s refused: %s", agent, name, exc)
        return CommandError(code=ErrorCode.INVALID_PARAMS, error=str(exc)[:500], command=name)
    except TimeoutError:
        return CommandError(
            code=ErrorCode.TIMEOUT, error=f"{name} took over {timeout:.1f}s", command=name
        )
    except PydanticSerializationError as exc:
        return CommandError(
            code=ErrorCode.HANDLER_ERROR,
            error=f"{name} returned a result that is not JSON: {exc}",
            command=name,
        )
    except Exception as exc:
        log.exception("%s: command %s raised", agent, name)
        return CommandError(
            code=ErrorCode.HANDLER_ERROR,
            error=f"{name} failed: {type(exc).__name__}: {exc}"[:500],
            command=name,
        )
    return CommandResult(command=name, result=result, handled_by=handled_by)
