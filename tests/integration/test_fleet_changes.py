"""Fleet changes while the fleet runs, with real daemons on the real, secured broker.

Each test changes the fleet file, re-renders the broker (`vox broker render`, `vox broker
reload`) and the bundles of the agents concerned, and applies them in the order
docs/operations.md gives: masters reload (SIGHUP), they never restart. The witnesses are
the read-only explorer (every status and war-room message, stamped), the broker's log
(connections per client), the daemons' PIDs, and the specialists' own trace of each
command they executed.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.kits.brokerkit import NOT_AUTHORIZED, try_connect
from tests.kits.faultkit import Deployment, Processes, deploy, run_vox, status_json
from tests.kits.recorder import Recorder
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

pytestmark = pytest.mark.slow

HEARTBEAT = 1.0
KEEPALIVE = 5
TALLY = "tests.kits.agentkit:Tally"
SLEEPER = "tests.kits.roles_for_tests:Sleeper"
SLEEPER_COMMANDS = ["echo", "slow", "wedge"]
# Long enough for a master that lost sight of a child to call it stale (3 intervals).
STALE_WINDOW = 3 * HEARTBEAT + 1.5


@dataclass(frozen=True)
class Spec:
    """One agent of a test fleet: its master's name and its roles."""

    master: str | None
    roles: tuple[str, ...] = ()


# A coordinator under the root with a tally specialist and a sleeper specialist.
BRANCH = {
    "root": Spec(None),
    "coordinator": Spec("root"),
    "spec_a": Spec("coordinator", (TALLY,)),
    "spec_b": Spec("coordinator", (SLEEPER,)),
}


@dataclass
class LiveFleet:
    """A fleet file that changes while its broker and daemons run."""

    root: Path
    broker: LocalBroker
    dep: Deployment
    shape: dict[str, Spec]
    operator_id: UUID
    ids: dict[str, UUID] = field(default_factory=dict)

    def fleet_of(self, shape: dict[str, Spec]) -> Fleet:
        """Return the fleet of a shape; a name keeps its id across shapes."""
        return parse_fleet(self.text_of(shape))

    def text_of(self, shape: dict[str, Spec]) -> str:
        """Return the fleet file's text of a shape; a name keeps its id across shapes."""
        parts = [f'[operator]\nid = "{self.operator_id}"\n']
        for name, spec in shape.items():
            agent_id = self.ids.setdefault(name, uuid4())
            lines = [f'name = "{name}"', f'id = "{agent_id}"', f"heartbeat_interval = {HEARTBEAT}"]
            if spec.master is not None:
                lines.append(f'master_id = "{self.ids.setdefault(spec.master, uuid4())}"')
            lines.append("roles = [" + ", ".join(f'"{r}"' for r in spec.roles) + "]")
            tally = self.root / f"tally-{name}.txt"
            lines.append(f'[agents.settings]\ntally_file = "{tally}"')
            parts.append("[[agents]]\n" + "\n".join(lines) + "\n")
        return "\n".join(parts)

    def write(self, shape: dict[str, Spec]) -> Path:
        """Write the fleet file of a shape (the operator's edit) and return its path."""
        path = self.root / f"fleet-{len(list(self.root.glob('fleet-*.toml')))}.toml"
        path.write_text(self.text_of(shape))
        return path

    def change(self, shape: dict[str, Spec]) -> Fleet:
        """Make shape the fleet the next renders use."""
        self.shape = shape
        self.dep.fleet = self.fleet_of(shape)
        return self.dep.fleet

    def render_broker(self, *, rotate: tuple[str, ...] = (), reload: bool = True) -> None:
        """Re-render the broker from the current fleet as an operator does, and reload it.

        `vox broker render FLEET --out DIR` with no other option: the directory's
        render.json keeps the port, user and explorer of the first render.
        """
        fleet_file = self.write(self.shape)
        extra = ["--rotate", *rotate] if rotate else []
        out = run_vox("broker", "render", fleet_file, "--out", self.dep.broker_dir.root, *extra)
        assert out.returncode == 0, out.stderr
        if reload:
            self.reload_broker()

    def reload_broker(self) -> None:
        """Reload the running broker with what the broker directory holds now."""
        out = run_vox("broker", "reload", self.dep.broker_dir.root, "--pid", str(self.broker.pid))
        assert out.returncode == 0, out.stderr

    def render(self, name: str) -> Path:
        """Render the bundle of one agent from the current fleet, where its daemon reads it."""
        path = self.root / "etc" / f"{name}.toml"
        render_agent_config(
            self.dep.fleet,
            name,
            self.dep.broker_dir.root,
            path,
            self.dep.state_dir(name),
            keepalive=KEEPALIVE,
            shutdown_grace=2.0,
        )
        self.dep.configs[name] = path
        return path

    def reload_agent(self, processes: Processes, name: str) -> None:
        """Render one agent's bundle from the current fleet and tell its daemon (SIGHUP)."""
        self.render(name)
        processes[name].signal(signal.SIGHUP)

    def id(self, name: str) -> UUID:
        return self.ids[name]

    def creds(self, name: str) -> Credentials:
        return Credentials(
            username=str(self.id(name)),
            password=self.dep.broker_dir.credentials_for(name).password,
            host="127.0.0.1",
            port=self.dep.port,
        )

    def connections(self, name: str) -> int:
        """Return how often the broker logged a new connection of an agent's daemon."""
        return len(re.findall(rf"connected from \S+ as {self.id(name)} ", self.broker.log_text()))

    def tallies(self, name: str) -> list[int]:
        path = self.root / f"tally-{name}.txt"
        return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
def live(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker]
) -> Callable[[dict[str, Spec]], LiveFleet]:
    def start(shape: dict[str, Spec]) -> LiveFleet:
        holder = LiveFleet.__new__(LiveFleet)
        holder.root, holder.shape, holder.operator_id, holder.ids = tmp_path, shape, uuid4(), {}
        holder.dep = deploy(holder.fleet_of(shape), tmp_path, keepalive=KEEPALIVE)
        broker_dir = holder.dep.broker_dir
        holder.broker = broker_factory(broker_dir.conf.read_text(), port=broker_dir.port)
        return holder

    return start


class Operator:
    """The operator's console on its own thread: a steady flow of commands, and single ones."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.console: OperatorConsole | None = None
        self.sent: list[int] = []
        self.results: dict[int, Any] = {}
        self.errors: list[str] = []
        self._flowing = False
        self._workers: list[Future[None]] = []

    def __enter__(self) -> Operator:
        self.thread.start()
        self.console = OperatorConsole(self.config)
        self._run(self.console.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flow()
        assert self.console is not None
        self._run(self.console.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def _run(self, coro: Any, timeout: float = 40.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def send(self, command: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result details; raise CommandFailed."""
        assert self.console is not None
        reply = self._run(self.console.send_command(command, params, wait=20))
        details: dict[str, Any] = reply.details
        return details

    def start_flow(self, workers: int = 2) -> None:
        """Send `tally n` with a fresh n, back to back, from a few workers."""
        self._flowing = True
        counter = iter(range(1, 10**9))

        async def worker() -> None:
            assert self.console is not None
            while self._flowing:
                n = next(counter)
                self.sent.append(n)
                try:
                    reply = await self.console.send_command("tally", {"n": n}, wait=20)
                    self.results[n] = reply.details["result"]
                except CommandFailed as exc:
                    self.errors.append(f"tally {n}: {exc.code}: {exc.error}")

        self._workers = [
            asyncio.run_coroutine_threadsafe(worker(), self.loop) for _ in range(workers)
        ]

    def stop_flow(self) -> None:
        self._flowing = False
        for future in self._workers:
            future.result(60)
        self._workers = []

    def wait_results(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"only {len(self.results)} results: {self.errors}"
            time.sleep(0.05)


def start_all(live: LiveFleet, processes: Processes, rec: Recorder, names: list[str]) -> None:
    processes.start(live.dep, names)
    for name in names:
        rec.status(live.id(name), status="ACTIVE", timeout=30)


def hear_live(rec: Recorder, agent: UUID) -> None:
    """Wait for two heartbeats of agent: its master has heard it live, not only retained.

    A child known only from a retained status gets the reconnect grace before an alert
    (docs/liveness.md): without this wait a false alarm would be hidden, not avoided.
    """
    first = rec.status(agent, after=time.monotonic(), status="ACTIVE")
    rec.status(agent, after=first.at + 0.01, status="ACTIVE")


def wait_log(process: Any, text: str, timeout: float = 20.0, after: int = 0) -> str:
    """Return the first line of the daemon's log (from line `after` on) holding text."""
    deadline = time.monotonic() + timeout
    while True:
        for line in process.log().splitlines()[after:]:
            if text in line:
                return str(line)
        assert time.monotonic() < deadline, f"{process.name} never logged {text!r}"
        time.sleep(0.05)


# --- add --------------------------------------------------------------------------------------


def test_add_a_specialist_under_a_running_coordinator(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    shape = {
        "root": Spec(None),
        "coordinator": Spec("root"),
        "spec_a": Spec("coordinator", (TALLY,)),
        "spec_b": Spec("coordinator", (TALLY,)),
    }
    fleet = live(shape)
    coord = fleet.id("coordinator")
    with fleet.dep.recorder() as rec, Operator(fleet.dep.operator_config) as op:
        start_all(fleet, processes, rec, list(shape))
        rec.status(fleet.id("root"), status="ACTIVE", commands=["tally"], timeout=30)
        pid = processes["coordinator"].pid
        op.start_flow()
        op.wait_results(10)

        # Phases 3-5 of an addition: broker, the new agent, then its master.
        fleet.change({**shape, "spec_c": Spec("coordinator", (SLEEPER,))})
        fleet.render_broker()
        fleet.render("spec_c")
        processes.start(fleet.dep, ["spec_c"])
        rec.status(fleet.id("spec_c"), status="ACTIVE", timeout=30)
        fleet.render("coordinator")
        reloaded = time.monotonic()
        processes["coordinator"].signal(signal.SIGHUP)
        advert = rec.status(
            coord, after=reloaded, status="ACTIVE", commands=sorted(["tally", *SLEEPER_COMMANDS])
        )
        print(f"\nADVERTISED new child's commands {advert.at - reloaded:.3f}s after SIGHUP")
        assert advert.at - reloaded < HEARTBEAT
        wait_log(processes["coordinator"], "children +spec_c")

        answer = op.send("echo", text="hello new child")
        assert answer["result"]["text"] == "hello new child"
        settled = len(op.results)
        op.wait_results(settled + 10)
        op.stop_flow()

    assert op.errors == []
    assert sorted(op.results) == sorted(op.sent)
    executed = fleet.tallies("spec_a") + fleet.tallies("spec_b")
    assert sorted(executed) == sorted(op.sent)  # every one executed once: none lost, none twice
    assert fleet.tallies("spec_a")
    assert fleet.tallies("spec_b")
    assert processes["coordinator"].pid == pid
    assert processes["coordinator"].process is not None
    assert processes["coordinator"].process.poll() is None
    assert fleet.connections("coordinator") == 1
    assert rec.warroom(coord, fleet.id("spec_c")) == []


# --- retire -----------------------------------------------------------------------------------


def test_retire_a_specialist(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    shape = BRANCH
    fleet = live(shape)
    coord, spec_b = fleet.id("coordinator"), fleet.id("spec_b")
    old_creds = fleet.creds("spec_b")
    with fleet.dep.recorder() as rec:
        start_all(fleet, processes, rec, list(shape))
        rec.status(coord, status="ACTIVE", commands=sorted(["tally", *SLEEPER_COMMANDS]))
        pid = processes["coordinator"].pid

        # Its master is not reloaded first: `vox fleet retire` tells it.
        assert processes["spec_b"].stop() == 0
        rec.status(spec_b, status="INACTIVE", error_code="SHUTDOWN")
        new_fleet = fleet.write({k: v for k, v in shape.items() if k != "spec_b"})
        out = run_vox(
            "fleet", "retire", "spec_b", "--fleet", new_fleet, "--broker-dir",
            fleet.dep.broker_dir.root,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"cleared vox/{spec_b}/status" in out.stdout
        wait_log(processes["coordinator"], "retired: forgets spec_b")

        fleet.change({k: v for k, v in shape.items() if k != "spec_b"})
        fleet.render_broker()
        time.sleep(STALE_WINDOW)  # a master still watching spec_b would call it stale now
        fleet.reload_agent(processes, "coordinator")
        wait_log(processes["coordinator"], "the agent already runs it", timeout=10)

        looks = status_json(fleet.dep.operator_config)
        assert "spec_b" not in looks
        assert looks["coordinator"]["commands"] == ["tally"]
        warroom = run_vox("warroom", "--config", fleet.dep.operator_config, "--json")
        assert (warroom.returncode, warroom.stdout) == (0, "")
        watch = run_vox("watch", "--config", fleet.dep.operator_config, "--duration", "1.5")
        assert watch.returncode == 0, watch.stderr
        assert "spec_a" in watch.stdout
        assert "spec_b" not in watch.stdout
        assert rec.warroom(coord, spec_b) == []
        assert try_connect(old_creds) == NOT_AUTHORIZED
        assert processes["coordinator"].pid == pid
        assert fleet.connections("coordinator") == 1


# --- move -------------------------------------------------------------------------------------


def test_move_a_specialist_between_coordinators(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    shape = {
        "root": Spec(None),
        "coord_a": Spec("root"),
        "coord_b": Spec("root"),
        "spec_a": Spec("coord_a", (TALLY,)),
        "spec_b": Spec("coord_a", (SLEEPER,)),
    }
    fleet = live(shape)
    coord_a, coord_b, spec_b = (fleet.id(n) for n in ("coord_a", "coord_b", "spec_b"))
    with fleet.dep.recorder() as rec, Operator(fleet.dep.operator_config) as op:
        start_all(fleet, processes, rec, list(shape))
        rec.status(coord_a, status="ACTIVE", commands=sorted(["tally", *SLEEPER_COMMANDS]))
        hear_live(rec, spec_b)
        pids = {name: processes[name].pid for name in ("coord_a", "coord_b")}
        began = time.monotonic()
        epoch = rec.latest_status(spec_b)["epoch"]
        # A request coord_a delegated to spec_b is answered when coord_a lets spec_b go.
        pending = asyncio.run_coroutine_threadsafe(
            op.console.send_command("slow", {"seconds": 30}, wait=40),
            op.loop,  # type: ignore[union-attr]
        )
        time.sleep(0.5)

        # Phase 1: the old master forgets it while the broker still lets it read it.
        fleet.change({**shape, "spec_b": Spec("coord_b", (SLEEPER,))})
        fleet.reload_agent(processes, "coord_a")
        rec.status(coord_a, after=began, status="ACTIVE", commands=["tally"])
        wait_log(processes["coord_a"], "children -spec_b")
        with pytest.raises(CommandFailed) as failed:
            pending.result(10)
        assert failed.value.code == "TARGET_INACTIVE"

        # Phase 3: the broker; phase 4: the specialist restarts under its new master.
        fleet.render_broker()
        time.sleep(STALE_WINDOW)  # coord_a can no longer read spec_b: it must not mind
        fleet.render("spec_b")
        assert processes["spec_b"].stop() == 0
        processes.start(fleet.dep, ["spec_b"])
        reborn = rec.status(spec_b, status="ACTIVE", min_epoch=epoch + 1, timeout=30)
        assert reborn.json()["target"] == str(coord_b)

        # Phase 5: the new master learns it.
        fleet.reload_agent(processes, "coord_b")
        rec.status(coord_b, after=began, status="ACTIVE", commands=SLEEPER_COMMANDS)
        wait_log(processes["coord_b"], "children +spec_b")
        answer = op.send("echo", text="via coord_b")
        assert answer["result"]["text"] == "via coord_b"

    assert rec.warroom(coord_a, spec_b) == []
    assert rec.warroom(coord_b, spec_b) == []
    # Not even an attempt: coord_a never believed spec_b stale (see the control below).
    assert "spec_b ACTIVE -> STALE" not in processes["coord_a"].log()
    assert "refused the message" not in processes["coord_a"].log()
    for name, pid in pids.items():
        assert processes[name].pid == pid
        assert fleet.connections(name) == 1
    # The fleet's look: spec_b reports to coord_b, and coord_a no longer offers its skills.
    looks = status_json(fleet.dep.operator_config, wait=1.5)
    assert looks["spec_b"]["master_id"] == str(coord_b)
    assert looks["coord_a"]["commands"] == ["tally"]
    assert looks["coord_b"]["commands"] == SLEEPER_COMMANDS


def test_the_broker_before_the_old_master_makes_the_false_alarm_the_safe_order_avoids(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    """The control of the move test: the order of docs/operations.md is what prevents it."""
    shape = {
        "root": Spec(None),
        "coord_a": Spec("root"),
        "coord_b": Spec("root"),
        "spec_b": Spec("coord_a", (SLEEPER,)),
    }
    fleet = live(shape)
    coord_a, spec_b = fleet.id("coord_a"), fleet.id("spec_b")
    refused = f"refused the message on '{topics.warroom(coord_a, spec_b)}'"
    with fleet.dep.recorder() as rec:
        start_all(fleet, processes, rec, list(shape))
        rec.status(coord_a, status="ACTIVE", commands=SLEEPER_COMMANDS)
        hear_live(rec, spec_b)
        fleet.change({**shape, "spec_b": Spec("coord_b", (SLEEPER,))})
        wrong = time.monotonic()
        fleet.render_broker()  # the wrong order: coord_a still counts spec_b as its child
        # coord_a hears spec_b no more: it calls a healthy agent stale, stops offering its
        # skills, and raises HEARTBEAT_STALE, which the broker refuses (not its child now).
        rec.status(coord_a, after=wrong, status="ACTIVE", commands=[], timeout=STALE_WINDOW + 5)
        wait_log(processes["coord_a"], "spec_b ACTIVE -> STALE")
        wait_log(processes["coord_a"], refused)
        # It retries the post every tick; the log says the refusal once, not 4 times a second.
        time.sleep(2.0)
        assert processes["coord_a"].log().count(refused) == 1
        # Its reload lets the child go.
        fleet.reload_agent(processes, "coord_a")
        wait_log(processes["coord_a"], "children -spec_b")


# --- an invalid bundle ------------------------------------------------------------------------


def test_a_reload_with_an_invalid_or_restart_only_bundle_changes_nothing(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    shape = {
        "root": Spec(None),
        "coordinator": Spec("root"),
        "spec_a": Spec("coordinator", (SLEEPER,)),
    }
    fleet = live(shape)
    coord = fleet.id("coordinator")
    path = fleet.dep.configs["coordinator"]
    good = path.read_text()
    with fleet.dep.recorder() as rec:
        start_all(fleet, processes, rec, list(shape))
        rec.status(coord, status="ACTIVE", commands=SLEEPER_COMMANDS)
        pid = processes["coordinator"].pid
        cases = {
            "kind = 'agent'\n[agent\n": "invalid config",
            good.replace(f'master_id = "{fleet.id("root")}"', f'master_id = "{uuid4()}"'): (
                "agent.master_id"
            ),
            good.replace(f'"{fleet.id("spec_a")}" = "spec_a"', f'"{uuid4()}" = "spec_x"').replace(
                "heartbeat_interval = 1.0", "heartbeat_interval = 2.0"
            ): "agent.heartbeat_interval",
        }
        for text, why in cases.items():
            before = len(processes["coordinator"].log().splitlines())
            path.write_text(text)
            processes["coordinator"].signal(signal.SIGHUP)
            line = wait_log(processes["coordinator"], "nothing changed", after=before)
            lines = processes["coordinator"].log().splitlines()[before:]
            said = [entry for entry in lines if "SIGHUP" in entry]
            assert said == [line], said
            assert why in line
            assert "restart the agent to apply it" in line or "invalid config" in line
        path.write_text(good)
        time.sleep(2 * HEARTBEAT)
        assert rec.latest_status(coord)["commands"] == SLEEPER_COMMANDS
        assert processes["coordinator"].pid == pid
        assert fleet.connections("coordinator") == 1
        # The running config still serves: its child is still routed to.
        out = run_vox("send", "--config", fleet.dep.operator_config, "echo", "text=still", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["result"]["text"] == "still"


# --- re-key ---------------------------------------------------------------------------------


def test_rekey_one_agent_keeps_everyone_else_connected(
    live: Callable[[dict[str, Spec]], LiveFleet], processes: Processes
) -> None:
    shape = BRANCH
    fleet = live(shape)
    spec_b = fleet.id("spec_b")
    with fleet.dep.recorder() as rec:
        start_all(fleet, processes, rec, list(shape))
        hear_live(rec, spec_b)
        epoch = rec.latest_status(spec_b)["epoch"]
        old = fleet.creds("spec_b")
        pid = processes["spec_b"].pid

        # 1. A new secret for spec_b alone; the broker still knows the old one.
        fleet.render_broker(rotate=("spec_b",), reload=False)
        new = fleet.creds("spec_b")
        assert new.password != old.password
        # 2. spec_b is told: its new bundle, SIGHUP; it stays connected meanwhile.
        before = len(processes["spec_b"].log().splitlines())
        fleet.reload_agent(processes, "spec_b")
        told = wait_log(processes["spec_b"], "SIGHUP", after=before)
        assert "a new broker secret, used from the next connection on" in told
        # 3. The broker reload cuts the old secret; spec_b is back with the new one at once.
        reloaded = time.monotonic()
        fleet.reload_broker()
        back = rec.status(spec_b, after=reloaded, status="ACTIVE", min_epoch=epoch + 1)
        took = back.at - reloaded
        print(f"\nRE-KEY: broker reload -> spec_b ACTIVE with its new secret {took:.3f}s")
        assert try_connect(old) == NOT_AUTHORIZED
        out = run_vox("send", "--config", fleet.dep.operator_config, "echo", "text=rekeyed")
        assert out.returncode == 0, out.stderr
        time.sleep(STALE_WINDOW)  # a false staleness would show now

    # No false staleness, no incident: the coordinator never lost sight of spec_b for long.
    assert [s for s in rec.seen if s.topic.startswith("vox/warroom/")] == []
    assert "spec_b ACTIVE -> STALE" not in processes["coordinator"].log()
    assert processes["spec_b"].pid == pid  # told, not restarted
    # Every other agent kept its one connection; spec_b logged in anew, with its new secret.
    for name in ("root", "coordinator", "spec_a"):
        assert fleet.connections(name) == 1, name
    assert fleet.connections("spec_b") == 2
