"""`vox fleet diff|retire`: what a fleet-file change means; clear a retired agent."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from vox_mqtt.fleet.diff import FleetDiff, diff_fleets
from vox_mqtt.fleet.plan import plan_steps
from vox_mqtt.fleet.retirement import retire_agent
from vox_mqtt.protocol.hierarchy import load_fleet

from ._common import EXIT_RUNTIME, EXIT_USAGE, fail, out_console, print_json

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet-change verbs (docs/operations.md)."""
    fleet = subparsers.add_parser("fleet", help="change a running fleet: diff, retire")
    verbs = fleet.add_subparsers(dest="fleet_verb", metavar="ACTION", required=True)
    diff = verbs.add_parser(
        "diff", help="what a change of the fleet file means, per host, and in which order"
    )
    diff.add_argument("old", type=Path, help="the fleet file the fleet runs now")
    diff.add_argument("new", type=Path, help="the changed fleet file")
    diff.add_argument(
        "--broker-dir",
        default="/etc/vox/broker",
        help="the broker directory, as the steps should name it (default /etc/vox/broker)",
    )
    diff.add_argument(
        "--bundles",
        default="bundles",
        help="where the steps render agent bundles on the broker host (default ./bundles)",
    )
    diff.add_argument("--json", action="store_true", help="print the diff and steps as JSON")
    diff.set_defaults(func=cmd_diff)

    retire = verbs.add_parser(
        "retire",
        help="clear what a retired agent left on the broker (status, war-room posts) and "
        "tell its master; run it before the broker is re-rendered without the agent",
    )
    retire.add_argument("name", help="the retired agent's name")
    retire.add_argument(
        "--fleet", type=Path, required=True, help="the fleet file, already without the agent"
    )
    retire.add_argument(
        "--broker-dir",
        type=Path,
        required=True,
        help="the broker directory, still holding the agent's credentials",
    )
    retire.add_argument(
        "--wait", type=float, default=3.0, help="seconds to wait for retained messages (3)"
    )
    retire.add_argument(
        "--force", action="store_true", help="retire it even though it still says ACTIVE"
    )
    retire.add_argument("--json", action="store_true", help="print what was done as JSON")
    retire.set_defaults(func=cmd_retire)


def cmd_diff(args: argparse.Namespace) -> int:
    """Print what changes between two fleet files and the steps that apply it."""
    old, new = load_fleet(args.old), load_fleet(args.new)
    diff = diff_fleets(old, new)
    steps = plan_steps(diff, fleet=str(args.new), broker_dir=args.broker_dir, bundles=args.bundles)
    signatures = {"old": old.signatures, "new": new.signatures}
    window = {"old": old.replay_window, "new": new.replay_window}
    if args.json:
        print_json(
            {
                **diff.as_dict(),
                "steps": [step.as_dict() for step in steps],
                "signatures": signatures,
                "replay_window": window,
            }
        )
    if diff.refused:
        for reason in diff.refused:
            fail(f"{args.new}: {reason}")
        return EXIT_USAGE
    if not args.json:
        out_console().print(_diff_text(diff, steps), markup=False, end="")
        out_console().print(_signatures_text(old.signatures, new.signatures), markup=False)
        if old.replay_window != new.replay_window:
            out_console().print(
                f"replay window: {old.replay_window:g} s -> {new.replay_window:g} s: `vox agent"
                " render` every bundle and SIGHUP every agent; each applies it at once"
                " (docs/security.md, replays)",
                markup=False,
            )
    return 0


def _signatures_text(old: str, new: str) -> str:
    """Say which signature mode is in force, and what a change of it takes."""
    if old == new:
        return f"signatures: {new} (unchanged)"
    return (
        f"signatures: {old} -> {new}: `vox broker render`, then `vox agent render` every bundle "
        "and SIGHUP every agent; each applies it at once, and one that starts or stops signing "
        "reconnects once, cleanly, so that its will is signed as the mode says "
        "(docs/security.md)"
    )


def _diff_text(diff: FleetDiff, steps: list[Any]) -> str:
    if diff.empty:
        return "no change: the fleet runs as this file describes\n"
    lines = ["changes:"]
    lines += [f"  {change.kind.value:<16} {change.text}" for change in diff.changes]
    broker = diff.broker
    if broker.changed:
        lines.append(f"broker: re-render and reload ({', '.join(broker.files)})")
    else:
        lines.append("broker: unchanged")
    if diff.actions:
        lines.append("agents:")
        width = max(len(action.name) for action in diff.actions)
        for action in diff.actions:
            why = "; ".join(action.reasons)
            lines.append(
                f"  {action.name:<{width}}  {action.action.value:<7} "
                f"(phase {int(action.phase)})  {why}"
            )
    lines.append("steps, in this order (docs/operations.md):")
    for step in steps:
        lines.append(f"  {step.number}. [{step.host}] {step.what}")
        lines += [f"       $ {command}" for command in step.commands]
    return "\n".join(lines) + "\n"


def cmd_retire(args: argparse.Namespace) -> int:
    """Clear a retired agent's leftovers on the broker and tell its master."""
    fleet = load_fleet(args.fleet)
    report = asyncio.run(
        retire_agent(fleet, args.name, args.broker_dir, wait=args.wait, force=args.force)
    )
    if args.json:
        print_json(
            {
                "name": report.name,
                "id": str(report.id),
                "last_status": report.last_status,
                "told": report.told,
                "cleared": report.cleared,
                "resolved_by_poster": report.resolved_by_poster,
                "left": report.left,
            }
        )
    else:
        console = out_console()
        last = report.last_status or "none kept"
        console.print(f"{report.name} ({report.id}): last status {last}", markup=False)
        if report.told:
            console.print(
                "said RETIRED to whoever watches it (its master forgets it)", markup=False
            )
        for topic in report.cleared:
            console.print(f"cleared {topic}", markup=False)
        for topic in report.resolved_by_poster:
            console.print(f"resolved by its poster: {topic}", markup=False)
    for line in report.left:
        fail(f"still on the broker: {line}")
    if report.left:
        return EXIT_RUNTIME
    if not args.json:
        out_console().print(
            f"nothing of {report.name} is left on the broker: now re-render the broker "
            "without it and reload it, so its credentials are refused",
            markup=False,
        )
    return 0
