"""`vox demo`: run the example fleet on this machine and narrate it with real output."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.text import Text

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.status import ACTIVE, INACTIVE
from vox_mqtt.protocol.errors import ConfigError, VoxError

from ._common import EXIT_RUNTIME, fail, out_console
from .demo_decisions import DecisionStep
from .fleet import draw_tree
from .localfleet import (
    DEMO_WATCHER,
    DemoLayout,
    ExplorerWatch,
    Ledgers,
    LocalFleet,
    VoxRun,
    run_vox,
)

__all__ = ["register"]

KILLED = "specialist_b"  # the specialist the demo kills (specialist_a watches the intake)
MAIL_WATCHER = "specialist_a"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the demo verb."""
    demo = subparsers.add_parser(
        "demo",
        help="run an example fleet on this machine (private broker, one daemon per agent)",
        description=(
            "Render the example fleet into DIR, start a private Mosquitto on a free port and "
            "one vox-agent per agent, walk through the contract's flows with real output, "
            "then stop everything it started."
        ),
    )
    demo.add_argument(
        "--dir", type=Path, default=Path("demo-fleet"), help="folder for its files (demo-fleet)"
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the fleet up afterwards (print how to explore it); stop with Ctrl-C",
    )
    demo.add_argument(
        "--sites",
        action="store_true",
        help="spread the fleet over a core broker and two chained site brokers, bridged as "
        "docs/federation.md renders them (each its own private Mosquitto)",
    )
    demo.add_argument(
        "--web",
        action="store_true",
        help="also serve the web console on the demo fleet (docs/web.md), print its URL and "
        "keep the fleet running",
    )
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo and return 0 when every step showed what it should."""
    demo = Demo(args.dir.absolute(), keep_running=args.keep_running or args.web, sites=args.sites)
    demo.web = args.web
    return asyncio.run(_interruptible(demo))


async def _interruptible(demo: Demo) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        return await demo.run()
    except asyncio.CancelledError:
        return 130
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


class Demo:
    """The narrated run: each step shows the commands and what they printed."""

    def __init__(self, directory: Path, *, keep_running: bool = False, sites: bool = False) -> None:
        self.layout = DemoLayout(directory)
        self.local = LocalFleet(self.layout, sites=sites)
        self.keep_running = keep_running
        self.out: Console = out_console()
        self.step = 0
        self.web = False
        self.web_url: str | None = None
        self.ledgers = Ledgers(self.layout)
        self._started = time.monotonic()

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Run every step; always stop what was started."""
        code = 0
        try:
            self.setup()
            assert self.local.broker_dir is not None
            observer = ExplorerWatch(self.local.broker_dir, self.layout.state(DEMO_WATCHER))
            async with observer:
                self.observer = observer
                await self.start_agents()
                if self.web:
                    self.local.start_web()
                    self.web_url = await self.local.web_url()
                    self.say(f"web console: open {self.web_url}  [dim](vox web, read-only)[/]")
                await self.analyze()
                await self.job_by_email()
                intake = self.layout.state(MAIL_WATCHER) / "intake"
                tuesday = _next_monday() + timedelta(days=1)
                await DecisionStep(self, intake=intake, tuesday=tuesday, mail=_mail).run()
                await self.financial_summary()
                await self.kill_a_specialist()
                if self.keep_running:
                    await self.hold()
        except asyncio.CancelledError:
            self.out.print("\n[yellow]interrupted[/]: stopping everything the demo started")
            code = 130
        except ConfigError:
            raise  # bad input (e.g. --dir): `vox` prints each problem and exits 2
        except VoxError as exc:
            fail(f"demo step {self.step} failed: {exc}")
            for name in self.local.processes:
                self.out.print(Text(f"--- last lines of {self.layout.log(name)} ---"))
                self.out.print(Text(self.local.log_tail(name)))
            code = EXIT_RUNTIME
        finally:
            await self.ledgers.close()
            await self.stop_console()
            clean = self.shutdown()
        return EXIT_RUNTIME if code == 0 and not clean else code

    async def stop_console(self) -> None:
        """Stop the operator's console the demo's verbs started, before its broker goes.

        The verbs are its clients (docs/operations.md, "The operator's console"); left
        running, it would outlive the fleet by its idle time, reconnecting to nothing.
        """
        operator = self.layout.config("operator")
        if not operator.exists():
            return
        with contextlib.suppress(OSError, TimeoutError):
            await run_vox(["console", "stop", "--config", str(operator)], timeout=30)

    def title(self, text: str) -> None:
        self.step += 1
        self.out.print()
        self.out.rule(f"[bold]{self.step}. {text}[/]")

    def say(self, text: str) -> None:
        self.out.print(text)

    def shown(self, path: Path) -> str:
        """Return a path as short as possible for printing (relative to the cwd)."""
        with contextlib.suppress(ValueError):
            return str(path.relative_to(Path.cwd()))
        return str(path)

    async def vox(self, *args: str, check: bool = True) -> VoxRun:
        """Run a vox command, print it and its output."""
        printable = " ".join(self.shown(Path(a)) if a.startswith("/") else a for a in args)
        self.out.print(Text(f"$ vox {printable}", style="bold cyan"))
        run = await run_vox(args)
        for line in run.output.rstrip("\n").splitlines():
            self.out.print(Text(f"  {line}"))
        if check and run.code != 0:
            raise VoxError(f"`vox {printable}` exited with {run.code}")
        return run

    # --- 1. setup ---------------------------------------------------------------------------

    def setup(self) -> None:
        self.title("The fleet: rendered from one fleet file")
        fleet = self.local.render()
        self.fleet = fleet
        layout = self.layout
        self.say(f"$ vox init {self.shown(layout.fleet)}")
        for line in draw_tree(fleet).splitlines():
            self.out.print(Text(f"  {line}"))
        if fleet.brokers:
            self.say(
                f"$ vox broker render {self.shown(layout.fleet)} --broker {fleet.root_broker} "
                f"--out {self.shown(layout.broker)} --explorer --explorer demo-watcher"
            )
        else:
            self.say(
                f"$ vox broker render {self.shown(layout.fleet)} --out {self.shown(layout.broker)}"
                " --explorer --explorer demo-watcher"
            )
        self.say(
            "  mosquitto.conf, an ACL that lets each agent write only to its master's and"
            " children's inboxes, passwd and one credentials file per identity"
        )
        dirs = {fleet.root_broker: layout.broker}
        for site, rendered in self.local.site_dirs.items():
            upstream = next(b.upstream for b in fleet.brokers if b.name == site)
            dirs[site] = rendered.root
            self.say(
                f"$ vox broker render {self.shown(layout.fleet)} --broker {site} --out "
                f"{self.shown(rendered.root)} --upstream-dir {self.shown(dirs[upstream])}"
            )
            self.say(f"  and a bridge to {upstream!r} carrying exactly the topics that must cross")
        for name in [fleet.operator_name, *(a.name for a in fleet)]:
            where = dirs.get(fleet.agent(name).broker if name != fleet.operator_name else None)
            self.say(
                f"$ vox agent render {self.shown(layout.fleet)} {name} --broker-dir "
                f"{self.shown(where or layout.broker)} --out {self.shown(layout.config(name))}"
            )
        broker = self.local.start_broker()
        self.say(
            f"started a private mosquitto on 127.0.0.1:{broker.port} (pid {broker.pid}, "
            f"log {self.shown(broker.log_path)})"
        )
        for site, site_broker in self.local.site_brokers.items():
            self.say(
                f"started site {site}'s mosquitto on 127.0.0.1:{site_broker.port} "
                f"(pid {site_broker.pid}), bridged upstream"
            )

    async def start_agents(self) -> None:
        self.title("One vox-agent daemon per agent, leaves first")
        fleet = self.fleet
        started = time.monotonic()
        levels: dict[int, list[str]] = {}
        for agent in fleet:
            levels.setdefault(fleet.depth_of(agent.id), []).append(agent.name)
        # Leaves first: each master's birth then already lists what its children serve.
        for depth in sorted(levels, reverse=True):
            agents = [fleet.agent(name) for name in levels[depth]]
            for agent in agents:
                process = self.local.start_agent(agent.name)
                roles = ", ".join(r.rpartition(":")[2] for r in agent.roles) or "-"
                self.say(
                    f"$ vox-agent --config {self.shown(self.layout.config(agent.name))}  "
                    f"[dim]# pid {process.pid}, roles: {roles}, log "
                    f"{self.shown(self.layout.log(agent.name))}[/]"
                )
            ids = [a.id for a in agents]
            await self.observer.wait_for(
                functools.partial(self._ready, ids),
                what="ACTIVE statuses of " + ", ".join(a.name for a in agents),
                fleet=self.local,
            )
        took = time.monotonic() - started
        self.say(f"all {len(fleet)} agents published ACTIVE on vox/<id>/status in {took:.1f}s")
        self.say(
            "the root advertises: " + ", ".join(self._commands(fleet.root.id)) + " [dim](analyze "
            "is its coordinator's, learned from its status; the root never hears of specialists)[/]"
        )

    def _ready(self, ids: list[UUID]) -> bool:
        """Tell whether these agents are ACTIVE and advertise their children's commands."""
        for agent_id in ids:
            mine = set(self._commands(agent_id))
            children = self.fleet.children_of(agent_id)
            if not self._active(agent_id) or any(
                not set(self._commands(c.id)) <= mine for c in children
            ):
                return False
        return True

    def _active(self, agent_id: UUID) -> bool:
        entry = self.observer.status(agent_id)
        return entry is not None and entry.status == ACTIVE

    def _commands(self, agent_id: UUID) -> tuple[str, ...]:
        entry = self.observer.status(agent_id)
        return () if entry is None else entry.commands

    # --- 2. seed 000: analyze down the tree and back ----------------------------------------

    async def analyze(self) -> None:
        self.title("analyze: operator -> root -> coordinator -> specialist, and back")
        op = str(self.layout.config("operator"))
        run = await self.vox("send", "--config", op, "--json", "analyze", "target=invoice-2026.pdf")
        answer: Any = run.json()
        request_id = UUID(answer["reply_to"])
        self.say(
            f"the operator's request {str(request_id)[:8]} was answered by "
            f"{answer['handled_by_name']}, which answers for its children's work; each ledger "
            "holds its own hop of the chain (any id a view prints, or its first 8 digits, "
            "is accepted back):"
        )
        root_rows = await self.ledgers.rows("root")
        down = _row(root_rows, message_type="command_request", reply_to=str(request_id))
        coord_rows = await self.ledgers.rows("coordinator")
        further = _row(coord_rows, message_type="command_request", reply_to=down["message_id"])
        specialist = self._name_of(further["target"])
        self.say("")
        await self.vox("ledger", str(self._db("root")), "trace", str(request_id)[:8])
        await self.vox("ledger", str(self._db("coordinator")), "trace", down["message_id"][:8])
        await self.vox("ledger", str(self._db(specialist)), "trace", further["message_id"][:8])

    def _name_of(self, agent_id: str) -> str:
        return self.fleet.agent(UUID(agent_id)).name

    def _db(self, name: str) -> Path:
        return self.ledgers.path(name)

    # --- 3. seed 003: a job by e-mail -------------------------------------------------------

    async def job_by_email(self) -> None:
        self.title("A job arrives by e-mail and becomes a notification for the operator")
        intake = self.layout.state(MAIL_WATCHER) / "intake"
        monday = _next_monday()
        saturday = monday + timedelta(days=5)
        mails = {
            "1-netwire.eml": _mail(
                "Ana Souza <ana@netwire.example>",
                "Translation O-26",
                monday.replace(hour=9),
                monday.replace(hour=17),
                120,
                "30 USD",
                "Client: Netwire\nProject O-26-XXXXX-TRA-YYY\nDeadline: end of day.",
            ),
            "2-weekend.eml": _mail(
                "Bo <bo@weekend.example>",
                "Saturday rush",
                saturday.replace(hour=10),
                saturday.replace(hour=14),
                60,
                "80 USD",
                "Needs Saturday work.",
            ),
            "3-broken.eml": _mail(
                "Cy <cy@broken.example>",
                "No timezone",
                monday.replace(hour=9, tzinfo=None),
                monday.replace(hour=12),
                30,
                "10 USD",
                "The start time has no timezone.",
            ),
        }
        self.say(f"{MAIL_WATCHER} (MailWatcher) watches {self.shown(intake)}; dropping 3 files:")
        first = next(iter(mails))
        for line in mails[first].splitlines():
            self.out.print(Text(f"  | {line}", style="dim"))
        for name, text in mails.items():
            tmp = intake / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, intake / name)
            self.say(f"  wrote {self.shown(intake / name)}")
        operator_id = str(self.fleet.operator_id)
        await self.observer.wait_for(
            lambda: all(
                (intake / sub / name).exists()
                for sub, name in (
                    ("processed", "1-netwire.eml"),
                    ("processed", "2-weekend.eml"),
                    ("rejected", "3-broken.eml"),
                )
            ),
            what="the intake files to be acknowledged or rejected",
            fleet=self.local,
        )
        await self.ledgers.wait_for(
            "root",
            lambda r: (
                (r["message_type"], r["action"], r["target"])
                == ("job_detected", LedgerAction.SENT, operator_id)
            ),
            what="the root's notification to the operator",
        )
        await self._wait_log("coordinator", "does not fit")
        self.say("")
        self._show_log(MAIL_WATCHER, ("rejected intake file", "acknowledged by"))
        reason = (intake / "rejected" / "3-broken.eml.reason").read_text().strip()
        self.say(f"  {self.shown(intake / 'rejected' / '3-broken.eml.reason')}: {reason}")
        self._show_log("coordinator", ("fits", "does not fit"))
        self._show_log("root", ("notified to the operator",))
        self.say("")
        await self.vox("inbox", "--config", str(self.layout.config("operator")), "--wait", "1")

    async def _wait_log(self, name: str, text: str) -> None:
        await self.observer.wait_for(
            lambda: text in self._log_text(name),
            what=f"{text!r} in {name}'s log",
            fleet=self.local,
        )

    def _log_text(self, name: str) -> str:
        try:
            return self.layout.log(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _show_log(self, name: str, needles: tuple[str, ...]) -> None:
        self.say(f"[dim]{self.shown(self.layout.log(name))}:[/]")
        for line in self._log_text(name).splitlines():
            if "examples.freelance" in line and any(n in line for n in needles):
                self.out.print(Text(f"  {line}"))

    # --- 4. data_request / data_response ----------------------------------------------------

    async def financial_summary(self) -> None:
        self.title("financial_summary: a data_request to the coordinator, its data_response")
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        start, end = today.isoformat(), (today + timedelta(days=31)).isoformat()
        op = str(self.layout.config("operator"))
        run = await self.vox(
            "send", "--config", op, "--json", "financial_summary",
            f"start_date={start}", f"end_date={end}",
        )  # fmt: skip
        answer: Any = run.json()
        result = answer["result"]
        for attachment in result["attachments"]:
            self.say(f"[dim]{self.shown(Path(attachment))}:[/]")
            for line in Path(attachment).read_text().splitlines():
                self.out.print(Text(f"  {line}"))

    # --- 5. liveness: a specialist dies -----------------------------------------------------

    async def kill_a_specialist(self) -> None:
        self.title(f"{KILLED} is killed with SIGKILL: its will, the war room, the status")
        victim = self.fleet.agent(KILLED)
        coordinator = self.fleet.agent("coordinator")
        pid = self.local.kill_agent(KILLED)
        self.say(f"$ kill -KILL {pid}   [dim]# {KILLED}[/]")

        def incident() -> bool:
            return any(
                i.topic.source == coordinator.id and i.topic.subject == victim.id
                for i in self.observer.incidents()
            )

        took = await self.observer.wait_for(
            lambda: (
                (entry := self.observer.status(victim.id)) is not None
                and entry.status == INACTIVE
                and incident()
            ),
            what=f"{KILLED} INACTIVE and the coordinator's war-room post",
        )
        self.say(
            f"the broker published {KILLED}'s will (INACTIVE, VM_CONNECTION_LOST) and the "
            f"coordinator posted system_failure to the war room within {took:.1f}s"
        )
        op = str(self.layout.config("operator"))
        await self.vox("warroom", "--config", op)
        await self.vox("status", "--config", op, "--wait", "1")
        await self.vox("watch", "--config", op, "--duration", "1")
        self.say(f"restarting {KILLED}:")
        process = self.local.start_agent(KILLED)
        self.say(
            f"$ vox-agent --config {self.shown(self.layout.config(KILLED))}  # pid {process.pid}"
        )
        took = await self.observer.wait_for(
            lambda: self._active(victim.id) and not incident(),
            what=f"{KILLED} ACTIVE again and the incident resolved",
            fleet=self.local,
        )
        entry = self.observer.status(victim.id)
        epoch = "?" if entry is None else entry.epoch
        self.say(
            f"{KILLED} is ACTIVE again (epoch {epoch}) and the coordinator resolved the "
            f"incident, {took:.1f}s after the restart"
        )

    # --- keep running, shut down ------------------------------------------------------------

    async def hold(self) -> None:
        self.title("The fleet keeps running")
        assert self.local.broker_dir is not None
        creds = self.local.broker_dir.credentials_for("explorer")
        op = self.shown(self.layout.config("operator"))
        intake = self.shown(self.layout.state(MAIL_WATCHER) / "intake")
        # The read-only looks above used the operator's identity, whose session the broker
        # then ended; one persistent connection again, so the broker keeps the root's
        # notifications for the operator while no console is connected.
        await run_vox(["inbox", "--config", str(self.layout.config("operator")), "--wait", "0.2"])
        self.say("Attach an MQTT explorer (read-only identity, MQTT v5):")
        self.say(f"  host {creds.host}  port {creds.port}")
        self.say(f"  username {creds.username}")
        self.say(f"  password {creds.password}")
        self.say("  subscribe to vox/#")
        # This login is the user's alone (the demo watches as explorer-demo-watcher); a
        # second explorer on it would kick the first off (docs/operations.md).
        broker = self.shown(self.layout.broker)
        site = f" --broker {self.fleet.root_broker}" if self.fleet and self.fleet.brokers else ""
        self.say("  one identity per explorer; give another one its own:")
        self.say(
            f"  $ vox broker render {self.shown(self.layout.fleet)}{site} --out {broker}"
            " --explorer NAME"
        )
        if self.local.broker is not None:
            self.say(f"  $ vox broker reload {broker} --pid {self.local.broker.pid}")
        self.say(
            f"  $ vox agent render {self.shown(self.layout.fleet)} explorer-NAME "
            f"--broker-dir {broker} --out NAME/explorer.toml"
        )
        self.say("Try, in another terminal:")
        for line in (
            f"vox status --config {op}",
            f"vox watch --config {op}",
            f"vox warroom --config {op} --follow",
            f"vox send --config {op} analyze target=hello",
            f"cp a-mail.eml {intake}/ && vox inbox --config {op}",
            f"vox ledger {self.shown(self._db('coordinator'))} tail",
        ):
            self.say(f"  $ {line}")
        if self.web_url is not None:
            self.say(f"The web console of this fleet: {self.web_url}")
        self.say("Press Ctrl-C to stop everything.")
        await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels the run

    def shutdown(self) -> bool:
        """Stop everything; return whether every daemon stopped cleanly and nothing is left."""
        if not self.local.started:
            return True
        self.title("Clean shutdown: SIGTERM to every daemon, then the broker")
        codes = self.local.stop()
        for name, code in codes.items():
            word = "stopped cleanly" if code == 0 else f"exit code {code}"
            self.say(f"  {name}: {word}")
        pids = [pid for group in self.local.started.values() for pid in group]
        alive = self.local.leftovers()
        if alive:
            fail(f"still running: {alive}")
        else:
            self.say(f"  mosquitto stopped; all {len(pids)} processes the demo started have exited")
        self.say(f"demo finished in {time.monotonic() - self._started:.1f}s; files in "
                 f"{self.shown(self.layout.root)}")  # fmt: skip
        return not alive and all(code == 0 for code in codes.values())


def _row(rows: list[dict[str, Any]], **match: str) -> dict[str, Any]:
    for row in reversed(rows):
        if all(row.get(key) == value for key, value in match.items()):
            return dict(row)
    raise VoxError(f"no ledger row with {match}")


def _next_monday() -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + timedelta(days=(7 - today.weekday()) % 7 or 7)


def _mail(
    sender: str,
    subject: str,
    start: datetime,
    end: datetime,
    effort: int,
    price: str,
    body: str,
) -> str:
    return (
        f"From: {sender}\nSubject: {subject}\nStart: {start.isoformat()}\n"
        f"End: {end.isoformat()}\nEffort-Minutes: {effort}\nPrice: {price}\n\n{body}\n"
    )
