"""`vox send --follow`: each transition of the request as it happens, and Ctrl-C to cancel.

The transitions come from the operator's agent (`OperatorConsole.follow`): sent,
acknowledged, working or delegated, progress, and the final one (docs/operations.md,
"Find and cancel a stuck command"). With --json each is one JSON object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from vox_mqtt.console.operator import OperatorConsole, Sent
from vox_mqtt.console.safetext import shown
from vox_mqtt.protocol.errors import CommandFailed

from ._common import EXIT_RUNTIME, fail, out_console

__all__ = [
    "EXIT_INTERRUPTED",
    "describe",
    "follow_command",
    "follow_via_console",
    "transition_line",
]

EXIT_INTERRUPTED = 130
# After the answer came, how long the final transition may still take to be printed.
_FINAL_GRACE = 1.0


def describe(details: Any) -> str:
    """Return a progress report as a line: each level's state, fraction and text, top first.

    No level names an agent (docs/messages.md): the chain reads "delegated > working 40%".
    """
    parts: list[str] = []
    part = details
    while isinstance(part, dict) and len(parts) < 64:
        words = [str(part.get("state", "?"))]
        fraction = part.get("fraction")
        if isinstance(fraction, int | float):
            words.append(f"{fraction * 100:.0f}%")
        if part.get("text"):
            words.append(str(part["text"]))
        parts.append(" ".join(words))
        part = part.get("below")
    return " > ".join(parts)


def _at(value: Any) -> datetime | None:
    try:
        at = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def transition_line(transition: dict[str, Any], first: datetime | None) -> str:
    """Return one transition as a line: its time, the time since the request was sent, what."""
    state = str(transition.get("state", "?"))
    at = _at(transition.get("at"))
    clock = "?" if at is None else at.strftime("%H:%M:%S.%f")[:-3]
    since = "" if at is None or first is None else f" +{(at - first).total_seconds():.3f}s"
    details = transition.get("details")
    extra = ""
    if state == "progress" and isinstance(details, dict):
        extra = describe(details)
    elif state in ("working", "delegated") and isinstance(details, dict):
        # The state is the line's own word: only what the level below said is added.
        extra = describe(details.get("below"))
    elif isinstance(details, dict) and (details.get("error_code") or details.get("code")):
        extra = f"{details.get('error_code') or details.get('code')}: {details.get('error', '')}"
    return f"{clock}{since} {state}" + (f" {extra}" if extra else "")


async def _print_transitions(console: OperatorConsole, request_id: UUID, as_json: bool) -> None:
    out = out_console()
    first: datetime | None = None
    async for transition in console.follow(request_id):
        if first is None:
            first = _at(transition.get("at"))
        if as_json:
            print(
                json.dumps({"request_id": str(request_id), **transition}, default=str), flush=True
            )
        else:
            out.print(shown(transition_line(transition, first), 400))
            sys.stdout.flush()


class _Choice(enum.Enum):
    """How the question "cancel?" ended."""

    YES = "yes"
    NO = "no"  # the answer no, an empty one, or no terminal to ask on
    ANSWERED = "answered"  # the request's answer came first: it ends the question
    AGAIN = "again"  # a second Ctrl-C: the command ends at once


async def _ask_to_cancel(
    request_id: UUID, answer: asyncio.Future[Any], again: asyncio.Event
) -> _Choice:
    """Ask on the terminal whether to cancel, raced with the answer and a second Ctrl-C.

    No terminal (or no answer) means no. The line is read from the terminal as the loop
    sees it readable, never in a thread: nothing is left blocked on it when the command ends.
    """
    if not sys.stdin.isatty():
        return _Choice.NO
    print(f"\ncancel request {request_id}? [y/N] ", end="", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    line: asyncio.Future[bytes] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        if not line.done():
            line.set_result(data)

    try:
        loop.add_reader(fd, readable)
    except (OSError, ValueError, NotImplementedError):
        return _Choice.NO
    second = asyncio.ensure_future(again.wait())
    try:
        await asyncio.wait({line, answer, second}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)
        second.cancel()
    if again.is_set():
        return _Choice.AGAIN
    if not line.done():  # the answer came while the question was asked
        print(file=sys.stderr, flush=True)  # end the question's line
        return _Choice.ANSWERED
    text = line.result().decode(errors="replace")
    return _Choice.YES if text.strip().lower() in ("y", "yes") else _Choice.NO


async def _unless_again(work: asyncio.Future[Any], again: asyncio.Event) -> bool:
    """Wait for work unless a second Ctrl-C comes first; return whether work is done."""
    second = asyncio.ensure_future(again.wait())
    try:
        await asyncio.wait({work, second}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        second.cancel()
    return work.done()


def _ended_again(request_id: UUID, canceling: bool) -> int:
    """The second Ctrl-C: end now, and say where the request stands and how to reach it."""
    where = "cancel asked for, its end not awaited" if canceling else "left running"
    fail(
        f"interrupted again: request {request_id} {where}: `vox request show {request_id}`, "
        f"`vox cancel {request_id}`"
    )
    return EXIT_INTERRUPTED


INTERRUPT_REASON = "interrupted by the operator"
# How long a Ctrl-C's cancel waits for every level to confirm, as `vox cancel` and the
# console's /v1/cancel do by default (a frozen level would otherwise hold it longer).
_CANCEL_WAIT = 10.0


class Interruptible:
    """Ctrl-C while a request is followed: the operator's question "stop this?", not a crash.

    The first Ctrl-C asks whether to cancel (or cancels at once with --cancel-on-interrupt),
    raced with the answer, which ends the question; a second one ends the follower at once,
    whatever it waits for (docs/operations.md). Only a main thread's loop takes a signal:
    anywhere else no Ctrl-C reaches it, and nothing is installed.
    """

    def __init__(self, args: argparse.Namespace, request_id: UUID) -> None:
        self._args = args
        self._request_id = request_id
        self._interrupted, self._again = asyncio.Event(), asyncio.Event()
        self._loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.add_signal_handler(signal.SIGINT, self._on_interrupt)

    def _on_interrupt(self) -> None:
        (self._again if self._interrupted.is_set() else self._interrupted).set()

    async def wait(
        self, waiting: asyncio.Future[Any], cancel: Callable[[], Awaitable[dict[str, Any]]]
    ) -> int | None:
        """Wait for `waiting`; return an exit code if an interruption ended the follower."""
        request_id, again = self._request_id, self._again
        if await _unless_again(waiting, self._interrupted):
            return None
        choice = (
            _Choice.YES
            if self._args.cancel_on_interrupt
            else await _ask_to_cancel(request_id, waiting, again)
        )
        if choice is _Choice.AGAIN:
            return _ended_again(request_id, canceling=False)
        if choice is _Choice.NO:
            fail(
                f"request {request_id} left running: `vox request show {request_id}`, "
                f"`vox cancel {request_id}`"
            )
            return EXIT_INTERRUPTED
        if choice is _Choice.YES:
            canceling = asyncio.ensure_future(cancel())
            if not await _unless_again(canceling, again):
                canceling.cancel()
                return _ended_again(request_id, canceling=True)
            report = canceling.result()
            if not self._args.json:
                # What the cancel has done: `canceling` names the level not yet confirmed.
                said = report.get("line") or report.get("state", "?")
                out_console().print(f"cancel: {shown(str(said))}")
        if not await _unless_again(waiting, again):
            return _ended_again(request_id, canceling=choice is _Choice.YES)
        return None

    def close(self) -> None:
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.remove_signal_handler(signal.SIGINT)


async def follow_command(
    console: OperatorConsole,
    args: argparse.Namespace,
    params: dict[str, Any],
    show_answer: Callable[[Any], int],
) -> int:
    """Send the command, print its transitions until its answer; Ctrl-C offers a cancel.

    The question is raced with the answer (the answer ends it), and a second Ctrl-C ends
    the command at once, whatever it waits for (docs/operations.md).
    """
    sent: Sent = await console.start_command(args.command, params, wait=args.timeout)
    request_id = sent.request_id
    if not args.json:
        out_console().print(f"[dim]request {request_id}[/]")
    printer = asyncio.ensure_future(_print_transitions(console, request_id, args.json))
    answer = asyncio.ensure_future(sent.answer())
    interrupting = Interruptible(args, request_id)

    async def cancel() -> dict[str, Any]:
        return await console.cancel(request_id, reason=INTERRUPT_REASON, wait=_CANCEL_WAIT)

    try:
        ended = await interrupting.wait(answer, cancel)
        if ended is not None:
            return ended
        try:
            reply = answer.result()
        except CommandFailed as exc:
            await _settle(printer)
            if args.json:
                print(json.dumps({"ok": False, "code": exc.code, "error": exc.error}), flush=True)
            else:
                fail(f"{args.command}: {exc.code}: {exc.error}")
            return EXIT_RUNTIME
        await _settle(printer)
        return show_answer(reply)
    finally:
        interrupting.close()
        printer.cancel()
        answer.cancel()
        with contextlib.suppress(asyncio.CancelledError, CommandFailed):
            await asyncio.gather(printer, answer, return_exceptions=True)


async def _settle(printer: asyncio.Future[None]) -> None:
    """Let the printer show the final transition the answer brought, within a grace."""
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(printer), _FINAL_GRACE)


async def follow_via_console(
    client: Any,
    args: argparse.Namespace,
    body: dict[str, Any],
    show_answer: Callable[[Any], int],
) -> int:
    """`vox send --follow` through the operator's console: its stream, printed as it comes.

    Ctrl-C asks as `follow_command` does; a cancel goes to the console too (`/v1/cancel`), so
    the request's end still comes down this stream (docs/operations.md).
    """
    stream = client.stream("/v1/send", body)
    first = await anext(stream, None)
    if first is None or first.get("kind") != "request":
        item = first or {"error": "the operator's console hung up"}
        code = item.get("code")
        if args.json and code is not None:
            print(json.dumps({"ok": False, "code": code, "error": item.get("error")}), flush=True)
        else:
            fail(f"{args.command}: " + (f"{code}: " if code else "") + str(item.get("error", "")))
        return EXIT_RUNTIME
    request_id = UUID(str(first["request_id"]))
    # Ctrl-C asks from before the first line shows: a person (or a test) who saw the request's
    # id and interrupts gets the question, never a bare KeyboardInterrupt.
    interrupting = Interruptible(args, request_id)
    if not args.json:
        try:
            out_console().print(f"[dim]request {request_id}[/]")
        except BaseException:
            interrupting.close()
            raise
    loop = asyncio.get_running_loop()
    end: asyncio.Future[dict[str, Any]] = loop.create_future()

    async def read() -> None:
        out = out_console()
        started: datetime | None = None
        try:
            async for item in stream:
                if item.get("kind") == "note":  # what the console knows, said at once
                    print(f"vox: {item.get('text', '')}", file=sys.stderr, flush=True)
                    continue
                if item.get("kind") != "transition":
                    if not end.done():
                        end.set_result(item)
                    return
                transition = {k: v for k, v in item.items() if k != "kind"}
                if started is None:
                    started = _at(transition.get("at"))
                if args.json:
                    print(json.dumps(transition, default=str), flush=True)
                else:
                    out.print(shown(transition_line(transition, started), 400))
                    sys.stdout.flush()
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if not end.done():
                end.set_result({"kind": "hung_up", "error": str(exc)})
        if not end.done():
            end.set_result({"kind": "hung_up", "error": "the operator's console hung up"})

    reader = asyncio.ensure_future(read())

    async def cancel() -> dict[str, Any]:
        body = {"request_id": str(request_id), "reason": INTERRUPT_REASON}
        _status, found = await client.call("POST", "/v1/cancel", body)
        report = found.get("report")
        return report if isinstance(report, dict) else {}

    try:
        ended = await interrupting.wait(end, cancel)
        if ended is not None:
            return ended
        final = end.result()
        if final.get("kind") == "answer":
            return show_answer(final)
        if final.get("kind") == "hung_up":
            fail(f"the operator's console hung up: request {request_id} stays with it")
            return EXIT_RUNTIME
        if args.json:
            print(
                json.dumps({"ok": False, "code": final.get("code"), "error": final.get("error")}),
                flush=True,
            )
        else:
            fail(f"{args.command}: {final.get('code')}: {final.get('error')}")
        return EXIT_RUNTIME
    finally:
        interrupting.close()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(reader, return_exceptions=True)
