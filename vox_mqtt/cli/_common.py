"""What every verb group shares: exit codes, consoles and error output."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

__all__ = ["EXIT_RUNTIME", "EXIT_USAGE", "err_console", "fail", "out_console", "print_json"]

EXIT_RUNTIME = 1
EXIT_USAGE = 2


def out_console() -> Console:
    """Return a console on stdout (plain when not a terminal)."""
    return Console(soft_wrap=True, highlight=False)


def err_console() -> Console:
    """Return a console on stderr."""
    return Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str) -> None:
    """Print one error line for a person on stderr."""
    print(f"vox: error: {message}", file=sys.stderr)


def print_json(data: Any) -> None:
    """Print data as indented JSON on stdout, for scripts."""
    print(json.dumps(data, indent=2, default=str))
