"""Say a repeated failure once a while, not at every retry."""

from __future__ import annotations

import logging
import time
from typing import Final

__all__ = ["Repeats"]

_SAY_AGAIN: Final = 60.0  # seconds before the same text is logged at its level again


class Repeats:
    """Log a text at its level the first time in a while, and at DEBUG while it repeats."""

    def __init__(self, logger: logging.Logger, *, every: float = _SAY_AGAIN) -> None:
        self.logger = logger
        self.every = every
        self._said: dict[str, float] = {}  # text -> when it was last logged at its level

    def log(self, level: int, text: str) -> None:
        """Log text at level, or at DEBUG if it was said within the last `every` seconds."""
        now = time.monotonic()
        said = self._said.get(text)
        if said is not None and now - said < self.every:
            self.logger.debug("%s", text)
            return
        self._said = {t: at for t, at in self._said.items() if now - at < self.every}
        self._said[text] = now
        self.logger.log(level, "%s", text)
