"""`vox-agent --config FILE`: run one agent daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vox_mqtt import __version__
from vox_mqtt.errors import ConfigError

from .daemon import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, AgentDaemon, prepare
from .logs import LEVELS, LogSetup

log = logging.getLogger("vox-agent")


def build_parser() -> argparse.ArgumentParser:
    """Build the daemon's argument parser."""
    parser = argparse.ArgumentParser(
        prog="vox-agent",
        description="Run one vox-mqtt agent: connect, announce, serve its roles until SIGTERM.",
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="the agent's config (`vox agent render`)"
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the config and roles, then exit (0 or 2)"
    )
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=os.environ.get("VOX_LOG_LEVEL", "info").lower(),
        help="least severe level logged (default: $VOX_LOG_LEVEL or info)",
    )
    parser.add_argument(
        "--log-file", type=Path, help="log here instead of stderr; SIGHUP reopens it"
    )
    parser.add_argument("--version", action="version", version=f"vox-agent {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon; exit 0 stopped cleanly, 1 failed, 2 bad config, 77 login refused."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_level not in LEVELS:
        parser.error(f"VOX_LOG_LEVEL must be one of {', '.join(LEVELS)}")
    try:
        logs = LogSetup(level=args.log_level, log_file=args.log_file)
    except OSError as exc:
        print(f"vox-agent: error: cannot open the log file: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        prepared = prepare(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("%s", problem)
        log.error("not starting: fix %s and start again", args.config)
        return EXIT_CONFIG
    if args.check:
        print(f"{args.config}: OK ({prepared.config.name}, {len(prepared.role_specs)} role(s))")
        return EXIT_OK
    try:
        return asyncio.run(AgentDaemon(prepared, logs=logs).run())
    except Exception:
        # A bug, not bad input: one log line (traceback folded in) and a restartable exit.
        log.critical("stopped by an unexpected error", exc_info=True)
        return EXIT_FAILURE
    finally:
        logs.close()


if __name__ == "__main__":
    sys.exit(main())
