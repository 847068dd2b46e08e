"""`vox ledger DB tail|trace|verify`: read an agent's ledger without changing it."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from ..errors import LedgerError
from ..ledger import VOXAgentMemory
from ._common import EXIT_RUNTIME, EXIT_USAGE, fail, out_console, print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ledger verbs."""
    ledger = subparsers.add_parser(
        "ledger", help="read an agent's ledger (logs.db): tail, trace, verify"
    )
    ledger.add_argument("db", type=Path, metavar="DB", help="the ledger file, e.g. logs.db")
    verbs = ledger.add_subparsers(dest="ledger_verb", metavar="VERB", required=True)

    tail = verbs.add_parser("tail", help="show the newest rows, oldest of them first")
    tail.add_argument("-n", "--rows", type=_positive, default=20, help="how many (default 20)")
    tail.add_argument("--json", action="store_true", help="print the rows as JSON")
    tail.set_defaults(func=cmd_tail)

    trace = verbs.add_parser("trace", help="rebuild a message's causality chain via reply_to")
    trace.add_argument("message_id", type=_uuid, metavar="MESSAGE_ID")
    trace.add_argument("--json", action="store_true", help="print the chain as JSON")
    trace.set_defaults(func=cmd_trace)

    verify = verbs.add_parser("verify", help="check the hash chain and the append-only triggers")
    verify.set_defaults(func=cmd_verify)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a message id (a UUID): {text!r}") from None


def _with_ledger(path: Path, work: Callable[[VOXAgentMemory], Awaitable[int]]) -> int:
    """Open the ledger read-only, run `work` on it and return its exit code."""
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        fail(f"ledger {path} {what}; pass the agent's logs.db")
        return EXIT_USAGE

    async def run() -> int:
        memory = VOXAgentMemory(path, read_only=True)
        try:
            await memory.init_db()
        except LedgerError as exc:
            fail(str(exc))
            return EXIT_USAGE
        try:
            return await work(memory)
        finally:
            await memory.close()

    return asyncio.run(run())


def _console() -> Console:
    console = out_console()
    if not console.is_terminal:
        # Piped output keeps one row per line, so UUIDs stay whole for grep and copy.
        console.width = max(console.width, 200)
    return console


def _short(value: str | None) -> str:
    return "" if value is None else value[:8]


def _note(row: dict[str, Any]) -> str:
    details = row["details"]
    parts = [row["outcome"], row["reason"]]
    for key in ("command", "code", "handled_by", "in_response_to"):
        if isinstance(details.get(key), str):
            short = key in ("handled_by", "in_response_to")
            parts.append(f"{key}={_short(details[key]) if short else details[key]}")
    if "sha256" in details:
        parts.append(f"{details.get('size')} bytes sha256={str(details['sha256'])[:12]}")
    return " ".join(str(part) for part in parts if part)


def cmd_tail(args: argparse.Namespace) -> int:
    """Print the newest rows of a ledger."""

    async def work(memory: VOXAgentMemory) -> int:
        rows = list(reversed(await memory.get_recent(args.rows)))
        if args.json:
            print_json(rows)
            return 0
        table = Table(title=f"{args.db}: last {len(rows)} rows", title_justify="left")
        for name in ("#", "recorded_at", "action", "type", "message_id", "from", "to", "reply_to"):
            table.add_column(name, no_wrap=name != "type")
        table.add_column("note")
        for row in rows:
            cells = (
                str(row["id"]),
                row["recorded_at"],
                row["action"],
                row["message_type"] or row["event_type"],
                row["message_id"] or "",
                _short(row["source"]),
                _short(row["target"]),
                _short(row["reply_to"]),
                _note(row),
            )
            table.add_row(*(escape(cell) for cell in cells))
        _console().print(table)
        return 0

    return _with_ledger(args.db, work)


def cmd_trace(args: argparse.Namespace) -> int:
    """Print the reply_to chain a message belongs to, as a tree."""

    async def work(memory: VOXAgentMemory) -> int:
        chain = await memory.trace(args.message_id)
        if not chain:
            fail(f"message {args.message_id} is not in {args.db}")
            return EXIT_RUNTIME
        if args.json:
            print_json(chain)
            return 0
        _console().print(render_chain(chain, str(args.message_id)))
        return 0

    return _with_ledger(args.db, work)


def render_chain(chain: list[dict[str, Any]], focus: str) -> Tree:
    """Draw a trace as a tree by reply_to, the asked-for message in bold."""
    tree = Tree(f"[dim]causality chain, {len(chain)} messages[/]")
    nodes: dict[str, Tree] = {}
    for row in chain:
        mid = row["message_id"]
        label = escape(
            f"{row['message_type'] or row['event_type']} {mid}  "
            f"{_short(row['source'])} → {_short(row['target'])}  "
            f"[{', '.join(row['actions'])}]  {row['recorded_at']}"
        )
        note = escape(_note(row))
        label = f"[bold]{label}[/]" if mid == focus else label
        parent = nodes.get(row["reply_to"] or "", tree)
        nodes[mid] = parent.add(f"{label}  [dim]{note}[/]" if note else label)
    return tree


def cmd_verify(args: argparse.Namespace) -> int:
    """Check a ledger's hash chain; exit 1 naming the first bad row."""

    async def work(memory: VOXAgentMemory) -> int:
        report = await memory.verify()
        if not report.ok:
            where = (
                "" if report.first_bad_row is None else f" (first bad row: {report.first_bad_row})"
            )
            fail(f"ledger {args.db} failed verification{where}: {report.problem}")
            return EXIT_RUNTIME
        out_console().print(
            f"ok: {args.db}: {report.rows} rows, hash chain intact, append-only triggers in place"
        )
        return 0

    return _with_ledger(args.db, work)
