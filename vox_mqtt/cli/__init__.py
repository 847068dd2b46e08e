"""The `vox` command: a thin face over the library, one module per verb group."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from vox_mqtt.protocol.errors import ConfigError, FleetError, VoxError

from ._common import EXIT_RUNTIME, EXIT_USAGE, fail

__all__ = ["main"]

# Each module defines register(subparsers); its verbs set `func(args) -> int`.
_VERB_MODULES = (
    "fleet",
    "fleetchange",
    "ledger",
    "agent",
    "broker",
    "session",
    "decide",
    "ops",
    "lifecycle",
    "exporter",
    "web",
    "console",
    "mcpdoor",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every verb group."""
    parser = argparse.ArgumentParser(
        prog="vox",
        description="Operate a vox-mqtt fleet: hierarchical agents that talk VOX over MQTT.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    for name in _VERB_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `vox` command line and return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (FleetError, ConfigError) as exc:
        for problem in exc.problems:
            fail(problem)
        return EXIT_USAGE
    except VoxError as exc:
        fail(str(exc))
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Whoever read the output left (`vox send --follow | head`): no traceback, and
        # nothing more written to the closed pipe at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
