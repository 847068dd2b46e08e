"""`vox decide N approve|reject [--note TEXT]`: the human's decision on job #N of the inbox."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.console.decisions import VERDICTS, Job, choose_job, verdict_word
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.safetext import shown
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import ErrorCode

from ._common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    add_config_option,
    add_one_shot_option,
    config_path,
    fail,
    out_console,
    print_json,
)
from ._home import ConsoleUnreachable, one_shot_wanted, operator_lock, reach

__all__ = ["job_json", "job_summary", "register"]

MAX_NOTE: Final = 2000
# A decision the fleet refused for a reason a person can act on: exit 2, like bad input.
# Anything else (no answer in time, a delivery failure) leaves the outcome unknown: exit 1.
REFUSALS: Final = frozenset(
    {
        "UNKNOWN_JOB",
        "ALREADY_DECIDED",
        "JOB_EXPIRED",
        ErrorCode.UNAUTHORIZED_SOURCE,
        ErrorCode.INVALID_MESSAGE,
    }
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `decide`."""
    decide = subparsers.add_parser(
        "decide",
        help="approve or reject job #N of `vox inbox`: the root relays it to the coordinator",
    )
    add_config_option(decide, agent_too=False)
    decide.add_argument("number", type=int, metavar="N", help="the job's number in `vox inbox`")
    decide.add_argument("verdict", choices=VERDICTS)
    decide.add_argument("--note", default=None, help="a note for the record (free text)")
    decide.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)"
    )
    decide.add_argument("--json", action="store_true")
    add_one_shot_option(decide)
    decide.set_defaults(func=cmd_decide)


def cmd_decide(args: argparse.Namespace) -> int:
    """Send one decision and print what it changed, or why it was refused."""
    if args.note is not None and len(args.note) > MAX_NOTE:
        fail(f"--note is {len(args.note)} characters; keep it within {MAX_NOTE}")
        return EXIT_USAGE
    if not args.timeout > 0:
        fail(f"--timeout must be a positive number of seconds, not {args.timeout}")
        return EXIT_USAGE
    path = config_path(args.config)
    if one_shot_wanted(args.one_shot):
        with operator_lock(path):
            return asyncio.run(_decide(path, args))
    return asyncio.run(_decide_via_console(path, args))


async def _decide_via_console(path: Path, args: argparse.Namespace) -> int:
    """`vox decide` through the operator's console (docs/operations.md)."""
    body = {"number": args.number, "verdict": args.verdict, "note": args.note, "wait": args.timeout}
    try:
        client = await reach(path)
        status, found = await client.call("POST", "/v1/decide", body)
    except (ConsoleUnreachable, OSError, asyncio.IncompleteReadError) as exc:
        fail(str(exc) or "the operator's console hung up")
        return EXIT_RUNTIME
    if status != 200:
        return _refused(args, None, str(found.get("error", status)))
    if not found.get("ok"):
        code = found.get("code")
        exit_code = EXIT_USAGE if code is None or code in REFUSALS else EXIT_RUNTIME
        return _refused(args, code, str(found.get("error", "")), exit_code=exit_code)
    return _decided(args, str(found.get("job_id")), found.get("outcome"), found.get("decision"))


def _decided(args: argparse.Namespace, job_id: str, outcome: Any, decision: Any) -> int:
    word = verdict_word(args.verdict)
    if args.json:
        print_json(
            {
                "ok": True,
                "job": args.number,
                "job_id": job_id,
                "verdict": args.verdict,
                "outcome": outcome,
                "decision": str(decision),
            }
        )
        return 0
    out_console().print(f"job #{args.number} {word}: {shown(str(outcome))}")
    return 0


async def _decide(path: Path, args: argparse.Namespace) -> int:
    async with OperatorConsole(path) as console:
        chosen = choose_job(console.jobs(), args.number, now=datetime.now(UTC))
        if isinstance(chosen, str):
            return _refused(args, None, chosen)
        try:
            answer = await console.decide(
                UUID(chosen.message_id), args.verdict, note=args.note, wait=args.timeout
            )
        except CommandFailed as exc:
            exit_code = EXIT_USAGE if exc.code in REFUSALS else EXIT_RUNTIME
            return _refused(args, exc.code, exc.error, exit_code=exit_code)
    return _decided(args, chosen.message_id, answer.details.get("outcome"), answer.reply_to)


def _refused(
    args: argparse.Namespace, code: str | None, reason: str, *, exit_code: int = EXIT_USAGE
) -> int:
    """Print why a decision was not recorded (one line) and return the exit code."""
    if args.json:
        print_json({"ok": False, "job": args.number, "code": code, "error": reason})
    else:
        prefix = f"{code}: " if code else ""
        fail(f"decide #{args.number} {args.verdict}: {prefix}{reason}")
    return exit_code


def job_summary(job: Job, jobs: Sequence[Job]) -> str:
    """Return the one line `vox inbox` prints under a job: its decision, or what it overlaps."""
    if job.decision is not None:
        word = verdict_word(job.decision.get("verdict"))
        outcome = job.decision.get("outcome")
        return f"{word} at {job.decision.get('decided_at', '?')}" + (
            f": {outcome}" if outcome else ""
        )
    states = []
    for number in job.overlaps:
        other = jobs[number - 1]
        state = "undecided" if other.decision is None else verdict_word(other.decision["verdict"])
        states.append(f"#{number} ({state})")
    overlaps = f"; overlaps {', '.join(states)}" if states else "; overlaps no undecided job"
    return f"undecided{overlaps}: `vox decide {job.number} approve|reject`"


def job_json(job: Job, jobs: Sequence[Job]) -> dict[str, Any]:
    """Return what `vox inbox --json` adds to a job notification."""
    return {
        "job": job.number,
        "decision": None if job.decision is None else dict(job.decision),
        "overlaps": list(job.overlaps),
        "summary": job_summary(job, jobs),
    }
