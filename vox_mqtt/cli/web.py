"""`vox web`: the fleet in a browser, live (docs/web.md).

It reads like `vox watch` (the operator's read-only `_watch` look, on a throw-away client
id, no session left behind) and serves the tree, the war room and each agent's page over
HTTP (or HTTPS with `--tls-cert/--tls-key`) with uvicorn, pushing what changed to the
browsers as server-sent events. With the operator's console config it also shows the
root's inbox and the requests the operator sent, read from the operator's state dir
(read-only). It sends nothing unless started with `--allow-send`: then it also logs in as
the operator itself (as `vox send` does) and offers the root's commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID

import uvicorn

from vox_mqtt.console.decisions import choose_job
from vox_mqtt.console.doors import DoorCounters, DoorLimits, HostRule, door_config
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.console.web import Hub, Sender, build_app
from vox_mqtt.console.web_operator import OperatorPages
from vox_mqtt.console.web_state import RESOLVED_FILE, WebState, bind_problem
from vox_mqtt.fleet.config import load_console_config
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed, ConfigError, Refused, VoxError
from vox_mqtt.transport.session import Session

from ._common import EXIT_RUNTIME, EXIT_USAGE, add_config_option, config_path, fail
from ._home import ConsoleUnreachable, one_shot_wanted, operator_lock, reach
from .exporter import add_door_options, door_settings, parse_listen
from .looks import Reader, load_reader

__all__ = ["register"]

DEFAULT_LISTEN: Final = "127.0.0.1:8080"
_PREFIX: Final = "vox web: "
_SEND_TIMEOUT: Final = 30.0
_ASK_TIMEOUT: Final = 10.0  # a cancel's or a request's levels' answer
_OPERATOR_POLL: Final = 1.0  # seconds between two looks at the operator's inbox and ledger


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `vox web`."""
    parser = subparsers.add_parser("web", help="serve a live web console of the fleet")
    add_config_option(parser)
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve (default {DEFAULT_LISTEN}; port 0 picks a free one); any "
        "address but loopback needs a token",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require the token in FILE (one line, 16+ characters) on every request",
    )
    token.add_argument(
        "--generate-token",
        action="store_true",
        help="require a fresh random token, printed in the URL at start",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="serve HTTPS with this certificate (chain) file; needs --tls-key",
    )
    parser.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--allow-send",
        action="store_true",
        help="offer a form that sends the root's commands, as the operator (default: read-only)",
    )
    add_door_options(parser)
    parser.set_defaults(func=cmd_web)


def _say(text: str) -> None:
    print(f"{_PREFIX}{text}", file=sys.stderr, flush=True)


def _token(args: argparse.Namespace) -> str | None:
    if args.generate_token:
        return secrets.token_urlsafe(24)
    if args.token_file is None:
        return None
    try:
        return str(args.token_file.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--token-file {args.token_file}: cannot read it: {exc}") from None


def _tls(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """Return the certificate and key to serve HTTPS with, checked; raise ValueError."""
    if args.tls_cert is None and args.tls_key is None:
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            args.tls_cert, args.tls_key
        )
    except ssl.SSLError as exc:  # an OSError too: caught first
        reason = exc.reason or str(exc)
        raise ValueError(
            f"--tls-cert {args.tls_cert} / --tls-key {args.tls_key}: not a PEM certificate "
            f"and its key ({reason})"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"--tls-cert {args.tls_cert} / --tls-key {args.tls_key}: cannot read them: "
            f"{exc.strerror or exc}"
        ) from None
    return args.tls_cert, args.tls_key


def _operator_pages(reader: Reader, config: Path) -> OperatorPages | None:
    """Return the operator's pages when the console runs with the operator's config."""
    if reader.kind != "operator":
        return None
    console = load_console_config(config)
    op = console.operator
    state = op.state_dir.expanduser()
    state = state if state.is_absolute() else config.absolute().parent / state
    names = {str(op.id): op.name, str(op.root_id): op.root_name}
    # The operator's bundle holds its sealing key: the inbox opens sealed notes with it.
    signing = console.signing
    seal_key = None if signing is None else signing.signing(config.absolute().parent).seal_key
    return OperatorPages(state_dir=state, operator_id=op.id, names=names, seal_key=seal_key)


def cmd_web(args: argparse.Namespace) -> int:
    """Serve the console until SIGTERM or SIGINT."""
    try:
        host, port = parse_listen(args.listen)
        token = _token(args)
        tls = _tls(args)
        rule, limits = door_settings(args, host)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    problem = bind_problem(host, token, tls is not None)
    if problem is not None:
        fail(problem)
        return EXIT_USAGE
    reader = load_reader(args.config, "watch")
    logging.basicConfig(level=logging.WARNING, format=f"{_PREFIX}%(message)s", stream=sys.stderr)
    if args.allow_send and reader.kind != "operator":
        fail("--allow-send needs the operator's console config: only the operator sends commands")
        return EXIT_USAGE
    try:
        listener = socket.create_server((host, port), family=_family(host), reuse_port=False)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return EXIT_USAGE
    operator = config_path(args.config) if args.allow_send else None
    try:
        pages = _operator_pages(reader, config_path(args.config))
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    with listener:
        return asyncio.run(
            _serve(reader, listener, host, token, operator, pages, tls, (rule, limits))
        )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _wanted(reader: Reader) -> list[str]:
    link_topics = [] if reader.links is None else list(reader.links.topics)
    if reader.kind == "agent":
        exact = reader.exact_liveness()
        return exact + ([topics.WARROOM_FILTER] if reader.warroom else []) + link_topics
    warroom = [topics.WARROOM_FILTER] if reader.warroom else []
    return [*topics.LIVENESS_FILTERS, *warroom, *link_topics]


async def _serve(
    reader: Reader,
    listener: socket.socket,
    host: str,
    token: str | None,
    operator: Path | None,
    pages: OperatorPages | None,
    tls: tuple[Path, Path] | None,
    door: tuple[HostRule, DoorLimits],
) -> int:
    observer = FleetObserver(stale_after=reader.stale_after, signing=reader.broker.signing)
    state = WebState(
        observer,
        top=reader.top,
        top_name=reader.top_name,
        links=reader.link_watch(),
        resolved_file=None if pages is None else pages.state_dir / RESOLVED_FILE,
    )
    hub = Hub(state)

    async def connected() -> None:
        state.link(True)
        _say(f"connected to the broker at {reader.broker.address} as {reader.broker.username}")

    async def disconnected(_exc: BaseException | None) -> None:
        state.link(False)

    session = Session(
        reader.broker,
        subscriptions=_wanted(reader),
        on_connect=connected,
        on_disconnect=disconnected,
        wait=False,
    )
    try:
        await session.__aenter__()
    except Refused as exc:
        fail(str(exc))
        return EXIT_USAGE
    try:
        async with contextlib.AsyncExitStack() as stack:
            sender = None
            if operator is not None and one_shot_wanted(False):
                # VOX_CONSOLE=one-shot: this process logs in as the operator itself, while
                # nothing else of the operator's runs (docs/web.md).
                stack.enter_context(operator_lock(operator))
                console = await stack.enter_async_context(OperatorConsole(operator))
                sender = _sender(console)
            elif operator is not None:
                # The page sends through the operator's console, which it starts when none
                # runs: this process never logs in as the operator (docs/web.md).
                try:
                    client = await reach(operator)
                except ConsoleUnreachable as exc:
                    fail(str(exc))
                    return EXIT_RUNTIME
                root_id = load_console_config(operator).operator.root_id
                sender = console_sender(operator, lambda: state.observer.view.get(root_id))
                _say(f"sending through the operator's console on {client.socket_path}")
            app = build_app(
                hub,
                token=token,
                sender=sender,
                allowed_hosts=door[0],
                operator=pages,
                secure=tls is not None,
            )
            # The Host guard and the bounded connections (docs/security.md, F27 and F29).
            config = door_config(
                app,
                rule=None,  # the app checks the Host itself (build_app)
                limits=door[1],
                counters=DoorCounters(),
                say=_say,
                tls=None if tls is None else (str(tls[0]), str(tls[1])),
            )
            server = _Server(config)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, server.stop)
            bound = listener.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            url = f"{'http' if tls is None else 'https'}://{shown}:{bound}/"
            _say(
                f"serving {url} for what {reader.name} ({reader.kind}) may read"
                + ("; commands may be sent" if sender is not None else "; read-only")
            )
            if token is not None:
                _say(f"open {url}?token={token}")
            pump = asyncio.ensure_future(_pump(session, state))
            push = asyncio.ensure_future(hub.run(lambda: server.should_exit))
            tasks = [pump, push]
            if pages is not None:
                tasks.append(asyncio.ensure_future(_follow(pages, hub)))
            try:
                await server.serve(sockets=[listener])
            finally:
                hub.close()
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if pages is not None:
                    await pages.close()
    finally:
        await session.__aexit__(None, None, None)
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by this verb's own signal handlers.

    uvicorn's would raise the signal again once it has stopped, so a SIGTERM would end the
    process as killed by it rather than with exit code 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        self.should_exit = True


async def _follow(pages: OperatorPages, hub: Hub) -> None:
    """Tell the browsers when the operator's inbox or ledger changed (docs/web.md)."""
    while True:
        changed = await pages.changed()
        if changed["inbox"] or changed["requests"]:
            hub.notify("operator", {**changed, "unread": pages.inbox(proven=False)["unread"]})
        await asyncio.sleep(_OPERATOR_POLL)


async def _pump(session: Session, state: WebState) -> None:
    async for inbound in session.messages():
        state.take(inbound)


def _failed(command: str | None, exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, CommandFailed) else type(exc).__name__
    error = exc.error if isinstance(exc, CommandFailed) else str(exc)
    out: dict[str, Any] = {"ok": False, "code": str(code), "error": error}
    if command is not None:
        out["command"] = command
    return out


def _answered(command: str, details: dict[str, Any], message_id: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "command": command,
        "result": details.get("result"),
        "summary": details.get("summary"),
        "handled_by": details.get("handled_by"),
        "message_id": None if message_id is None else str(message_id),
    }


def _sender(console: OperatorConsole) -> Sender:
    """The page's sender when this process is the operator's console (`--web`)."""

    def commands() -> list[str]:
        root = console.view.get(console.root_id)
        return [] if root is None or not root.healthy else list(root.commands)

    async def send(command: str, params: dict[str, Any]) -> dict[str, Any]:
        from vox_mqtt.console.doorlog import record_door  # loaded when the page sends

        try:
            sent = await console.start_command(command, params, wait=_SEND_TIMEOUT)
            with contextlib.suppress(VoxError):  # sent: a full disk fails it, not the answer
                await record_door(console, sent.request_id, command, "web")
            reply = await sent.answer()
        except VoxError as exc:
            return _failed(command, exc)
        return {**_answered(command, reply.details, reply.message_id), "request_id": None}

    async def decide(number: int, verdict: str, note: str | None) -> dict[str, Any]:
        chosen = choose_job(console.jobs(), number, now=datetime.now(UTC))
        if isinstance(chosen, str):
            return {"ok": False, "job": number, "code": None, "error": chosen}
        from vox_mqtt.console.doorlog import record_door  # loaded when the page decides

        job = UUID(chosen.message_id)
        try:
            answer = await console.decide(job, verdict, note=note, wait=_SEND_TIMEOUT)
        except (VoxError, ValueError) as exc:
            return {"job": number, **_failed(None, exc)}
        with contextlib.suppress(VoxError):  # decided: a full disk fails the row, not this
            await record_door(
                console, job, None, "web", "decision", verdict=verdict,
                decision=str(answer.reply_to),
            )  # fmt: skip
        outcome = answer.details.get("outcome")
        return {"ok": True, "job": number, "job_id": chosen.message_id, "outcome": outcome}

    async def cancel(request_id: str, reason: str | None) -> dict[str, Any]:
        from vox_mqtt.console.doorlog import record_door  # loaded when the page cancels

        try:
            report = await console.cancel(UUID(request_id), reason=reason, wait=_ASK_TIMEOUT)
        except VoxError as exc:
            return _failed(None, exc)
        finally:  # asked for, whatever the tree answers: the act came through this door
            with contextlib.suppress(VoxError, ValueError):
                await record_door(console, UUID(request_id), None, "web", "cancel")
        return {"ok": True, "report": report}

    async def show(request_id: str) -> dict[str, Any]:
        try:
            report = await console.request_status(UUID(request_id), wait=_ASK_TIMEOUT)
        except VoxError as exc:
            return _failed(None, exc)
        return {"ok": True, "report": report}

    return Sender(commands=commands, send=send, decide=decide, cancel=cancel, show=show)


def console_sender(config: Path, root: Callable[[], Any]) -> Sender:
    """Return the page's sender when the operator's console sends for it (`/v1/send`).

    The commands offered are the root's as this process's own look sees them. The console is
    reached again for each send: one that stopped after its idle time is started again.
    """

    def commands() -> list[str]:
        entry = root()
        return [] if entry is None or not entry.healthy else list(entry.commands)

    async def send(command: str, params: dict[str, Any]) -> dict[str, Any]:
        body = {
            "command": command,
            "params": params,
            "timeout": _SEND_TIMEOUT,
            "mode": "wait",
            "door": "web",  # the operator's ledger says which door it came through
        }
        try:
            client = await reach(config)
            async for item in client.stream("/v1/send", body):
                kind = item.get("kind")
                if kind == "answer":
                    return _answered(command, item.get("details") or {}, item.get("message_id"))
                if kind in ("failed", "refused"):
                    code = item.get("code") or "REFUSED"
                    return {
                        "ok": False,
                        "command": command,
                        "code": code,
                        "error": item.get("error"),
                    }
        except (OSError, ConsoleUnreachable, asyncio.IncompleteReadError, ValueError) as exc:
            return {"ok": False, "command": command, "code": "CONSOLE", "error": str(exc)}
        return {
            "ok": False,
            "command": command,
            "code": "CONSOLE",
            "error": "the operator's console hung up before the answer",
        }

    async def call(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            client = await reach(config)
            return await client.call("POST", path, body)
        except (OSError, ConsoleUnreachable, asyncio.IncompleteReadError, ValueError) as exc:
            return 0, {"ok": False, "code": "CONSOLE", "error": str(exc) or "no console"}

    async def decide(number: int, verdict: str, note: str | None) -> dict[str, Any]:
        body = {
            "number": number,
            "verdict": verdict,
            "note": note,
            "wait": _SEND_TIMEOUT,
            "door": "web",  # audited where the console notes doors
        }
        status, found = await call("/v1/decide", body)
        if status != 200:
            return {"ok": False, "code": found.get("code"), "error": found.get("error")}
        return {"job": number, **found}

    async def about(path: str, request_id: str, reason: str | None) -> dict[str, Any]:
        body = {"request_id": request_id, "reason": reason, "wait": _ASK_TIMEOUT, "door": "web"}
        status, found = await call(path, body)
        if status != 200:
            return {"ok": False, "code": found.get("code"), "error": found.get("error")}
        return {"ok": True, "report": found.get("report")}

    async def cancel(request_id: str, reason: str | None) -> dict[str, Any]:
        return await about("/v1/cancel", request_id, reason)

    async def show(request_id: str) -> dict[str, Any]:
        return await about("/v1/request", request_id, None)

    return Sender(commands=commands, send=send, decide=decide, cancel=cancel, show=show)
