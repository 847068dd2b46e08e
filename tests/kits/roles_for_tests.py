"""Roles the daemon tests mount: slow commands, a loop-wedging command, an echo."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vox_mqtt.agent.roles import Role, command


class Sleeper(Role):
    """Commands whose timing a test controls."""

    @command
    async def echo(self, text: str = "") -> dict[str, Any]:
        """Return the text, and the role's settings so a test sees they arrived."""
        return {"text": text, "settings": dict(self.settings)}

    @command
    async def slow(self, seconds: float = 1.0) -> dict[str, Any]:
        """Sleep without blocking the loop, then answer."""
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @command
    async def wedge(self, seconds: float = 1.0) -> dict[str, Any]:
        """Block the whole event loop, as a buggy handler would."""
        time.sleep(seconds)  # noqa: ASYNC251 - the point of this command
        return {"wedged": seconds}


class Broken(Role):
    """A role whose constructor rejects its settings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if "required" not in self.settings:
            raise ValueError("setting 'required' is missing")


class Numbers(Role):
    """Answers with as many 1e15 numbers as asked: a result that can outgrow a message."""

    @command
    async def numbers(self, count: int) -> list[float]:
        return [1e15] * count
