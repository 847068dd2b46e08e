"""The `vox` command: a thin face over the library, one module per verb group.

The verb table below names each verb, its help line and the module that registers it: the
parser is built from it without importing any verb's module, and only the module of the
verb being run is imported (and registers its real parser), so `vox --help` and each verb
load what they need and nothing else (docs/architecture.md, "The command line").
`tests/unit/test_cli_verbs.py` checks the table against what the modules register.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from vox_mqtt.protocol.errors import ConfigError, FleetError, VoxError

from ._common import EXIT_RUNTIME, EXIT_USAGE, fail

__all__ = ["VERBS", "build_parser", "main"]

# Each module defines register(subparsers); its verbs set `func(args) -> int`.
# (verb, module, help), in the order `vox --help` lists them.
VERBS: tuple[tuple[str, str, str], ...] = (
    (
        "init",
        "fleet",
        "write the seed example fleet file with fresh UUIDs, or --add an agent to one",
    ),
    ("uuid", "fleet", "print fresh UUIDs for new agents (uuid4)"),
    ("tree", "fleet", "draw the hierarchy of a fleet file and check every role path it names"),
    ("fleet", "fleetchange", "change a running fleet: diff, retire"),
    ("ledger", "ledger", "read an agent's ledger (logs.db): tail, trace, verify"),
    ("agent", "agent", "per-agent deployment files"),
    ("broker", "broker", "render and reload the fleet broker's security"),
    ("pki", "broker", "certificates for the broker and every identity"),
    ("send", "session", "send a command to the root and print the answer"),
    (
        "inbox",
        "session",
        "fetch the root's notifications, show them (new ones marked) and mark them read",
    ),
    (
        "decide",
        "decide",
        "approve or reject job #N of `vox inbox`: the root relays it to the coordinator",
    ),
    ("status", "ops", "show the liveness of every agent one may see"),
    ("watch", "ops", "live tree of the fleet coloured by health"),
    ("warroom", "ops", "list the open war-room incidents"),
    ("request", "lifecycle", "where a request you sent stands"),
    ("cancel", "lifecycle", "cancel a request you sent, down the tree"),
    ("exporter", "exporter", "serve every agent's liveness and metrics to Prometheus"),
    ("web", "web", "serve a live web console of the fleet"),
    ("console", "console", "the operator's resident console, which every verb is a client of"),
    (
        "mcp",
        "mcpdoor",
        "serve the fleet to an MCP client over stdio, through the operator's console",
    ),
    ("demo", "demo", "run an example fleet on this machine (private broker, one daemon per agent)"),
)


def build_parser(
    argv: Sequence[str] | None = None, *, every: bool = False
) -> argparse.ArgumentParser:
    """Build the argument parser: the chosen verb's module registers its real parsers.

    argv: the command line; its first word that is no option names the verb whose module
    is imported. The other verbs are a name and a help line (what `vox --help` and an
    unknown verb's error list). every: import and register every module (the tests').
    """
    parser = argparse.ArgumentParser(
        prog="vox",
        description="Operate a vox-mqtt fleet: hierarchical agents that talk VOX over MQTT.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = next((word for word in words if not word.startswith("-")), None)
    modules = {module for verb, module, _ in VERBS if every or verb == chosen}
    registered: set[str] = set()
    for verb, module, help in VERBS:
        if module in modules:
            if module not in registered:
                registered.add(module)
                importlib.import_module(f"{__name__}.{module}").register(subparsers)
        else:
            subparsers.add_parser(verb, help=help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `vox` command line and return its exit code."""
    parser = build_parser(argv)
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
