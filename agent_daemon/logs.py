"""The daemon's logging: one line per event on stderr (journald-aware) or in a log file."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

__all__ = ["LEVELS", "LogSetup", "OneLineFormatter", "under_journald"]

LEVELS = ("debug", "info", "warning", "error")

# sd-daemon(3) priority prefixes: journald strips them and stores the priority.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def under_journald(stream: TextIO | None = None) -> bool:
    """Return whether the stream is the journal's stdout/stderr stream ($JOURNAL_STREAM)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device or not inode:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    # Only trust the variable when stderr is still that stream, not a redirect.
    return f"{stat.st_dev}:{stat.st_ino}" == value


class OneLineFormatter(logging.Formatter):
    """Format a record as a single line; journald mode drops the timestamp for a priority."""

    def __init__(self, *, journald: bool) -> None:
        if journald:
            super().__init__("%(name)s: %(message)s")
        else:
            super().__init__(
                "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                datefmt="%Y-%m-%dT%H:%M:%S",
            )
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        """Return the record on one line; a traceback is folded in with ' | '."""
        text = super().format(record)
        # A multi-line record would become several journal entries with no priority.
        text = " | ".join(part for part in text.splitlines() if part.strip())
        if self.journald:
            return f"<{_PRIORITY.get(record.levelno, 6)}>{text}"
        return text


class LogSetup:
    """Own the root handler so SIGHUP can reopen a rotated log file or change the level."""

    def __init__(self, *, level: str = "info", log_file: Path | None = None) -> None:
        self.log_file = log_file
        self.level = level
        self._handler: logging.Handler | None = None
        self._previous_level = logging.getLogger().level
        self._install()

    def _install(self) -> None:
        root = logging.getLogger()
        if self.log_file is None:
            handler: logging.Handler = logging.StreamHandler(sys.stderr)
            formatter = OneLineFormatter(journald=under_journald())
        else:
            handler = logging.FileHandler(self.log_file, encoding="utf-8")
            formatter = OneLineFormatter(journald=False)
        handler.setFormatter(formatter)
        if self._handler is not None:
            root.removeHandler(self._handler)
            self._handler.close()
        root.addHandler(handler)
        root.setLevel(self.level.upper())
        self._handler = handler

    def reopen(self) -> None:
        """Reopen the log file (after logrotate moved it); re-check the journal stream."""
        self._install()

    def close(self) -> None:
        """Remove the handler and restore the previous level."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        logging.getLogger().setLevel(self._previous_level)
