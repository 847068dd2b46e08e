"""`vox ledger DB tail|trace|verify [--witness MASTER_DB]`: read a ledger without changing it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from vox_mqtt.console.safetext import shown
from vox_mqtt.fleet.config import SigningSection
from vox_mqtt.ledger.signatures import check_signatures
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.ledger.witness import check_against_witness
from vox_mqtt.protocol.errors import LedgerError

from ._common import EXIT_RUNTIME, EXIT_USAGE, fail, out_console, print_json
from ._ids import AmbiguousId, Names, names_for_ledger, normalize_prefix, pick_by_prefix

_NAMES_HELP = (
    "a fleet file or the agent's (or console's) config, to show names next to ids "
    "(default: the config found for this ledger, see docs/ledger.md)"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ledger verbs."""
    ledger = subparsers.add_parser(
        "ledger", help="read an agent's ledger (logs.db): tail, trace, verify"
    )
    ledger.add_argument("db", type=Path, metavar="DB", help="the ledger file, e.g. logs.db")
    verbs = ledger.add_subparsers(dest="ledger_verb", metavar="VERB", required=True)

    tail = verbs.add_parser("tail", help="show the newest rows, oldest of them first")
    tail.add_argument("-n", "--rows", type=_positive, default=20, help="how many (default 20)")
    _shows(tail, "rows")
    tail.set_defaults(func=cmd_tail)

    trace = verbs.add_parser("trace", help="rebuild a message's causality chain via reply_to")
    trace.add_argument(
        "message_id",
        type=_prefix,
        metavar="MESSAGE_ID",
        help="a message id, or its first digits as `tail` shows them (unique in this ledger)",
    )
    _shows(trace, "chain")
    trace.set_defaults(func=cmd_trace)

    verify = verbs.add_parser("verify", help="check the hash chain and the append-only triggers")
    verify.add_argument(
        "--witness",
        type=Path,
        metavar="MASTER_DB",
        help="also compare with the heads of it its master recorded (the master's logs.db)",
    )
    verify.add_argument(
        "--agent",
        type=_uuid,
        metavar="ID",
        help="whose ledger DB is, when the witness recorded several children",
    )
    verify.add_argument(
        "--keys",
        type=Path,
        metavar="SIGNING_TOML",
        help="also verify each received message's signature with this keys file "
        "(the agent's NAME.signing.toml from `vox agent render`: docs/security.md)",
    )
    verify.set_defaults(func=cmd_verify)


def _shows(verb: argparse.ArgumentParser, what: str) -> None:
    """Add the options of a verb that prints rows: --json, and --config for the names."""
    verb.add_argument("--json", action="store_true", help=f"print the {what} as JSON")
    verb.add_argument("--config", type=Path, metavar="FILE", help=_NAMES_HELP)


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
        raise argparse.ArgumentTypeError(f"not an agent id (a UUID): {text!r}") from None


def _prefix(text: str) -> str:
    try:
        return normalize_prefix(text, "message id")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolve_message_id(db: Path, prefix: str) -> UUID:
    """Return the one message id of a ledger that starts with prefix; raise ValueError."""
    if len(prefix) == 36:
        return UUID(prefix)
    # The prefix is hex digits and hyphens only (normalize_prefix), so LIKE sees no wildcard.
    uri = f"{db.absolute().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db_conn:
            rows = db_conn.execute(
                "SELECT DISTINCT message_id FROM logs WHERE message_id LIKE ? LIMIT 6",
                (f"{prefix}%",),
            ).fetchall()
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot read {db}: {exc}") from None
    return UUID(pick_by_prefix(prefix, (row[0] for row in rows), "message id", str(db)))


def _with_ledger(path: Path, work: Callable[[VOXAgentMemory], Awaitable[int]]) -> int:
    """Open the ledger read-only, run `work` on it and return its exit code."""
    return asyncio.run(_open_ledger(path, work))


async def _open_ledger(path: Path, work: Callable[[VOXAgentMemory], Awaitable[int]]) -> int:
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        fail(f"ledger {path} {what}; pass the agent's logs.db")
        return EXIT_USAGE
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


def _console() -> Console:
    console = out_console()
    if not console.is_terminal:
        # Piped output keeps one row per line, so UUIDs stay whole for grep and copy.
        console.width = max(console.width, 200)
    return console


def _short(value: str | None) -> str:
    return "" if value is None else value[:8]


def _note(row: dict[str, Any], names: Names) -> str:
    details = row["details"]
    parts = [row["outcome"], row["reason"]]
    for key in ("command", "code", "handled_by", "in_response_to", "verdict", "outcome"):
        value = details.get(key)
        if not isinstance(value, str):
            continue
        if key == "handled_by":
            value = names.label(value).replace(" ", ":")
        elif key == "in_response_to":
            value = _short(value)
        parts.append(f"{key}={value}")
    if "sha256" in details:
        parts.append(f"{details.get('size')} bytes sha256={str(details['sha256'])[:12]}")
    return " ".join(str(part) for part in parts if part)


def cmd_tail(args: argparse.Namespace) -> int:
    """Print the newest rows of a ledger."""

    names = names_for_ledger(args.db, args.config)

    async def work(memory: VOXAgentMemory) -> int:
        rows = list(reversed(await memory.get_recent(args.rows)))
        if args.json:
            for row in rows:
                row["source_name"] = names.name(row["source"])
                row["target_name"] = names.name(row["target"])
            print_json(rows)
            return 0
        table = Table(
            title=f"{shown(args.db)}: last {len(rows)} rows",
            title_justify="left",
            caption=shown(names.provenance()) or None,
            caption_justify="left",
        )
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
                names.label(row["source"]),
                names.label(row["target"]),
                _short(row["reply_to"]),
                _note(row, names),
            )
            table.add_row(*(shown(cell) for cell in cells))
        _console().print(table)
        return 0

    return _with_ledger(args.db, work)


def cmd_trace(args: argparse.Namespace) -> int:
    """Print the reply_to chain a message belongs to, as a tree."""
    names = names_for_ledger(args.db, args.config)

    async def work(memory: VOXAgentMemory) -> int:
        try:
            # A short read of its own; the ledger's schema was checked by init_db.
            message_id = resolve_message_id(args.db, args.message_id)
        except ValueError as exc:
            fail(str(exc))
            return EXIT_USAGE if isinstance(exc, AmbiguousId) else EXIT_RUNTIME
        chain = await memory.trace(message_id)
        if not chain:
            fail(f"message {message_id} is not in {args.db}")
            return EXIT_RUNTIME
        if args.json:
            for row in chain:
                row["source_name"] = names.name(row["source"])
                row["target_name"] = names.name(row["target"])
            print_json(chain)
            return 0
        _console().print(render_chain(chain, str(message_id), names))
        if names.provenance():
            _console().print(names.provenance(), markup=False, style="dim")
        return 0

    return _with_ledger(args.db, work)


def render_chain(chain: list[dict[str, Any]], focus: str, names: Names | None = None) -> Tree:
    """Draw a trace as a tree by reply_to, the asked-for message in bold."""
    names = names or Names()
    tree = Tree(f"[dim]causality chain, {len(chain)} messages[/]")
    nodes: dict[str, Tree] = {}
    for row in chain:
        mid = row["message_id"]
        label = shown(
            f"{row['message_type'] or row['event_type']} {mid}  "
            f"{names.label(row['source'])} → {names.label(row['target'])}  "
            f"[{', '.join(row['actions'])}]  {row['recorded_at']}"
        )
        note = shown(_note(row, names))
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
            f"ok: {shown(args.db)}: {report.rows} rows, hash chain intact,"
            " append-only triggers in place"
        )
        if args.keys is not None and (code := await _signed(memory)) != 0:
            return code
        return 0 if args.witness is None else await _witnessed(memory)

    async def _signed(memory: VOXAgentMemory) -> int:
        keyring = SigningSection(keys_file=args.keys.absolute()).signing(Path.cwd()).keyring
        seen = check_signatures(await memory.get_recent(2**62), keyring)
        if not seen.ok:
            row, why = seen.problems[0]
            fail(
                f"ledger {args.db}: {len(seen.problems)} received messages whose signature does "
                f"not verify (first: row {row}: {why})"
            )
            return EXIT_RUNTIME
        out_console().print(
            f"ok: {shown(args.db)}: {seen.verified} received messages signed by their senders"
            + (f", {seen.unsigned} unsigned" if seen.unsigned else "")
        )
        return 0

    async def _witnessed(memory: VOXAgentMemory) -> int:
        async def compare(witness: VOXAgentMemory) -> int:
            try:
                seen = await check_against_witness(memory, witness, args.agent)
            except LedgerError as exc:
                fail(str(exc))
                return EXIT_USAGE
            if not seen.ok:
                fail(f"ledger {args.db} disagrees with its master's {args.witness}: {seen.problem}")
                return EXIT_RUNTIME
            out_console().print(
                f"ok: {shown(args.db)} holds all {seen.heads} heads {shown(args.witness)}"
                f" witnessed of agent {seen.agent}"
            )
            if seen.note:
                out_console().print(f"note: {shown(seen.note)}")
            return 0

        return await _open_ledger(args.witness, compare)

    return _with_ledger(args.db, work)
