"""What every verb group shares: exit codes, consoles and error output."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vox_mqtt.console.safetext import plain
from vox_mqtt.protocol.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "add_config_option",
    "add_one_shot_option",
    "config_path",
    "duration",
    "err_console",
    "fail",
    "out_console",
    "print_json",
    "status_width",
    "terminal_width",
]

EXIT_RUNTIME = 1
EXIT_USAGE = 2

# Where `--config` is looked for when it is not given (docs/deploy.md).
CONFIG_ENV = "VOX_CONFIG"
DEFAULT_CONFIG = Path("/etc/vox/operator.toml")


def add_config_option(parser: argparse.ArgumentParser, *, agent_too: bool = True) -> None:
    """Add `--config FILE`, which falls back to $VOX_CONFIG, then /etc/vox/operator.toml."""
    who = (
        "the operator's console config (`vox agent render FLEET operator`); default: "
        f"${CONFIG_ENV}, else {DEFAULT_CONFIG}"
    )
    if agent_too:
        who += "; or an agent's daemon config, to see what that identity may read"
    parser.add_argument("--config", type=Path, default=None, metavar="FILE", help=who)


def add_one_shot_option(parser: argparse.ArgumentParser) -> None:
    """Add `--one-shot`: log in as the operator in this process, not through the console."""
    parser.add_argument(
        "--one-shot",
        action="store_true",
        help="log in as the operator in this process instead of through the operator's "
        "console (only while no console runs; also VOX_CONSOLE=one-shot)",
    )


def config_path(given: Path | None) -> Path:
    """Return the console config to use: --config, else $VOX_CONFIG, else /etc/vox/operator.toml.

    Raise ConfigError when none is given and the default does not exist.
    """
    if given is not None:
        return given
    env = os.environ.get(CONFIG_ENV, "").strip()
    if env:
        return Path(env)
    if DEFAULT_CONFIG.exists():
        return DEFAULT_CONFIG
    raise ConfigError(
        [
            f"no config: pass --config FILE, set ${CONFIG_ENV}, or install the operator's "
            f"console config as {DEFAULT_CONFIG} (`vox agent render FLEET operator --out ...`)"
        ]
    )


def duration(seconds: float) -> str:
    """Return a duration as a person reads it: 4.2s, 5m 12s, 3h 07m, 2d 04h."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s"


def out_console() -> Console:
    """Return a console on stdout (plain when not a terminal)."""
    from rich.console import Console  # loaded by the verbs that print through rich only

    return Console(soft_wrap=True, highlight=False, emoji=False)


def stdout_is_terminal() -> bool:
    """Return whether stdout is a terminal, as rich's Console decides (without loading rich).

    TTY_COMPATIBLE=0/1 and FORCE_COLOR (https://force-color.org/) overrule the device;
    tests/unit/test_cli_verbs.py holds this to rich's own answer.
    """
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_width() -> int:
    """Return the cells out_console() would use: $COLUMNS, else the terminal's, else 80.

    The same reckoning as rich's Console.width, for a verb that prints text the console
    rendered and loads no rich of its own (tests/unit/test_cli_verbs.py compares them).
    """
    columns = os.environ.get("COLUMNS", "")
    given = int(columns) if columns.isdigit() else None
    if given is not None and os.environ.get("LINES", "").isdigit():
        return given  # both sizes given: rich asks nothing more
    if stdout_is_terminal() and os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return 80
    if given is not None:
        return given
    width = 0
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def status_width(wide: bool) -> int | None:
    """Return the cells `vox status` may use: $COLUMNS, else the terminal's, else 200.

    None with --wide: every column, however wide.
    """
    if wide:
        return None
    return terminal_width() if stdout_is_terminal() or os.environ.get("COLUMNS") else 200


def err_console() -> Console:
    """Return a console on stderr."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


def fail(message: str) -> None:
    """Print one error line for a person on stderr (what came from outside as text only)."""
    text = "\n".join(plain(line) for line in message.split("\n"))
    print(f"vox: error: {text}", file=sys.stderr)


def print_json(data: Any) -> None:
    """Print data as indented JSON on stdout, for scripts."""
    print(json.dumps(data, indent=2, default=str))


def wide_console() -> Console:
    # A pipe gets 80 columns by default; a list of incidents needs more to stay readable.
    console = out_console()
    if not console.is_terminal:
        console.width = max(console.width, 200)
    return console
