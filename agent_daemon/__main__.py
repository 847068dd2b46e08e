"""`vox-agent --config FILE`: run one agent daemon (`--check [--login]`: only check it;
`--health`: print the running daemon's health)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from vox_mqtt import __version__
from vox_mqtt.broker.passwd import load_credentials
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import BrokerUnavailable, ConfigError
from vox_mqtt.transport.probe import probe_login

from .daemon import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    RUN_LOCK,
    AgentDaemon,
    Prepared,
    daemon_running,
    hold_early_reloads,
    prepare,
)
from .health import read_health
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
        "--login",
        action="store_true",
        help="with --check: also log in to the broker and subscribe to the inbox, then "
        "disconnect (refused while this agent's daemon runs if client ids are locked)",
    )
    parser.add_argument(
        "--health",
        action="store_true",
        help="print the running daemon's health and exit 0 (connected, ledger ok) or 1",
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
    """Run the daemon; exit 0 stopped cleanly, 1 failed, 2 bad config, 77 login refused.

    `--check` exits 0 or 2; with `--login`, 2 also for any failed login (docs/deploy.md).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (args.check or args.health):
        hold_early_reloads()  # a `systemctl reload` during start is applied, not fatal
    if args.log_level not in LEVELS:
        parser.error(f"VOX_LOG_LEVEL must be one of {', '.join(LEVELS)}")
    if args.login and not args.check:
        parser.error("--login goes with --check (vox-agent --config FILE --check --login)")
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
    if args.health:
        return _health(prepared)
    if args.check:
        print(f"{args.config}: OK ({prepared.config.name}, {len(prepared.role_specs)} role(s))")
        if not args.login:
            return EXIT_OK
        try:
            print(asyncio.run(check_login(prepared)))
        except (BrokerUnavailable, ConfigError) as exc:
            log.error("login check: %s", exc)
            return EXIT_CONFIG
        except Exception:
            log.critical("login check: stopped by an unexpected error", exc_info=True)
            return EXIT_FAILURE
        finally:
            logs.close()
        return EXIT_OK
    try:
        return asyncio.run(AgentDaemon(prepared, logs=logs).run())
    except Exception:
        # A bug, not bad input: one log line (traceback folded in) and a restartable exit.
        log.critical("stopped by an unexpected error", exc_info=True)
        return EXIT_FAILURE
    finally:
        logs.close()


def _health(prepared: Prepared) -> int:
    """Print the health the running daemon keeps in its state dir; 0 if it serves, else 1."""
    state_dir = Path(prepared.config.state_dir)
    name = prepared.config.name
    if daemon_running(state_dir) is False:
        # No process holds the run lock: whatever the file says is from a former run.
        print(f"{name}: not running (no vox-agent holds {state_dir / RUN_LOCK})")
        return EXIT_FAILURE
    ok, text = read_health(state_dir)
    print(f"{name}: {text}")
    return EXIT_OK if ok else EXIT_FAILURE


def _locked(prepared: Prepared) -> bool:
    """Return whether the broker may lock client ids (unknown counts as locked)."""
    password_file = prepared.file.broker.password_file
    if password_file is None:
        return True
    if not password_file.is_absolute():
        password_file = prepared.path.absolute().parent / password_file
    return load_credentials(password_file).client_id_locked


async def check_login(prepared: Prepared) -> str:
    """Log in as the agent, subscribe to its inbox, disconnect; return what was proven.

    Raise BrokerUnavailable (Refused for a refused login, a TLS failure or a refused
    subscription) or ConfigError when the check must not run. docs/deploy.md says why a
    locked client id makes it refuse while the daemon runs.
    """
    config = prepared.config
    s = config.broker
    if _locked(prepared):
        running = daemon_running(Path(config.state_dir))
        if running is not False:
            why = (
                "its daemon is running"
                if running
                else f"cannot tell whether its daemon runs (no access to {config.state_dir})"
            )
            raise ConfigError(
                [
                    f"not logging in as {config.name}: {why}, and the broker locks client ids "
                    "to usernames, so a login as this agent would take over its session and "
                    "disconnect it (docs/broker.md); its log and `systemctl status` say "
                    "whether it is connected"
                ]
            )
        # The broker uses the username as client id anyway: this is the agent's own session,
        # resumed and kept as the daemon leaves it (same expiry, nothing acknowledged).
        how = "on the agent's own session (its daemon is not running)"
    else:
        # A fresh client id and no session left behind: the running daemon is not touched.
        s = replace(s, client_id=f"{config.id}-check-{secrets.token_hex(4)}", session_expiry=0)
        how = f"as client {s.client_id}, no session left behind"
    inbox = topics.inbox_filter(config.id)
    await probe_login(s, inbox)
    return (
        f"login OK: {config.name} logged in to {s.address} as {s.username} {how}; "
        f"subscription to {inbox} granted; disconnected"
    )


if __name__ == "__main__":
    sys.exit(main())
