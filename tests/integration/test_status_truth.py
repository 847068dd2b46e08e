"""Every topic tells the truth about liveness, replayed statuses show no one alive, and a
leaf cannot pose as another agent (docs/liveness.md; docs/security.md, F23 and F26).

Real `vox-agent` daemons on a rendered, signed broker; an explorer reads as the rendered
explorer identity does; the attacker has the broker's power (every topic, no key); the
compromised leaf has its own login and key.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.kits.attackerkit import Attacker, Captured, add_attacker, target_fleet
from tests.kits.fleetproc import REPO, FleetProcesses, child_env, run_fleet, wait_until
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.config import load_daemon_config
from vox_mqtt.observe.statusbounds import WILL_EXPIRY
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, now_iso
from vox_mqtt.protocol.messages import serialize as dump
from vox_mqtt.transport.session import Session

pytestmark = pytest.mark.slow

WINDOW = 6.0  # the fleet's replay window: short enough to outlive in a test
SKEW = 1.0  # the clock skew every reader allows on top of it (one host here)
BEAT, STALE_AFTER = 1.0, 3.0  # each agent's heartbeat interval, stale after 3 of them


class Reader:
    """A raw MQTT v5 client logged in as the rendered explorer: reads vox/#, writes nothing."""

    def __init__(self, procs: FleetProcesses, topic: str) -> None:
        creds = procs.broker_dir.credentials_for("explorer")
        self.seen: list[tuple[float, str, bytes, bool, int | None]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=creds.username, protocol=mqtt.MQTTv5
        )
        self.client.username_pw_set(creds.username, creds.password)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", procs.broker_dir.port, keepalive=30)
        self.client.loop_start()
        wait_until(self.client.is_connected, 10, "the explorer's login")
        self.client.subscribe(topic, qos=1)

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        left = getattr(message.properties, "MessageExpiryInterval", None)
        with self._lock:
            self.seen.append(
                (time.monotonic(), message.topic, bytes(message.payload), message.retain, left)
            )

    def messages(self) -> list[tuple[float, str, bytes, bool, int | None]]:
        with self._lock:
            return list(self.seen)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def allow_skew(procs: FleetProcesses) -> None:
    """Set clock_skew in every [signing] table: the daemons' and the operator's."""
    for path in [*(a.config for a in procs.agents.values()), procs.operator_config]:
        text = path.read_text()
        assert f"replay_window = {WINDOW}" in text, text
        path.write_text(text.replace("[signing]", f"[signing]\nclock_skew = {SKEW}", 1))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[FleetProcesses]:
    with run_fleet(
        tmp_path,
        target_fleet("require", WINDOW),
        start=False,
        before_broker=add_attacker,
    ) as running:
        allow_skew(running)
        running.start_all()
        yield running


def look(procs: FleetProcesses) -> dict[str, dict[str, Any]]:
    """Run a fresh `vox status --json` as the operator; return its agents by id."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vox_mqtt.cli",
            "status",
            "--json",
            "--config",
            str(procs.operator_config),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return {a["id"]: a for a in json.loads(done.stdout)["agents"]}


async def until_routed(console: OperatorConsole, timeout: float = 40) -> None:
    async with asyncio.timeout(timeout):
        while True:
            root = console.view.get(console.root_id)
            if root is not None and root.healthy and "analyze" in root.commands:
                return
            await asyncio.sleep(0.05)


def details(payload: bytes) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(payload)["details"]
    return found


def test_after_a_sigkill_no_retained_topic_of_the_agent_says_active(
    procs: FleetProcesses,
) -> None:
    spec = procs.fleet.agent("spec_a").id
    asyncio.run(_routed(procs))
    live = Reader(procs, f"vox/{spec}/#")
    try:
        wait_until(lambda: any(m[1].endswith("/presence") for m in live.messages()), 20, "a beat")
        killed = time.monotonic()
        procs.agents["spec_a"].kill()

        def will_in() -> bool:
            return any(
                m[1] == topics.presence(spec) and details(m[2]).get("status") == "INACTIVE"
                for m in live.messages()
            )

        wait_until(will_in, 20, "the will")
        arrived = next(
            m[0]
            for m in live.messages()
            if m[1] == topics.presence(spec) and details(m[2]).get("status") == "INACTIVE"
        )
        print(f"SIGKILL -> the will at a live explorer: {(arrived - killed) * 1000:.0f} ms")
    finally:
        live.close()
    # A fresh explorer reads every retained topic of the agent: none says ACTIVE.
    fresh = Reader(procs, f"vox/{spec}/#")
    try:
        wait_until(lambda: len(fresh.messages()) >= 2, 10, "the retained status and presence")
        time.sleep(0.5)  # anything else retained comes with them
        read = fresh.messages()
    finally:
        fresh.close()
    assert {m[1] for m in read} == {topics.status(spec), topics.presence(spec)}
    assert all(m[3] for m in read), "all retained"
    for _, topic, payload, _, _ in read:
        assert b'"ACTIVE"' not in payload, (topic, payload)
    status = details(next(m[2] for m in read if m[1] == topics.status(spec)))
    assert "status" not in status
    assert status["commands"] == ["analyze"]
    will_read = next(m for m in read if m[1] == topics.presence(spec))
    will = details(will_read[2])
    assert (will["status"], will["error_code"]) == ("INACTIVE", "VM_CONNECTION_LOST")
    assert "set at connect" in will["detail"]
    # The broker's clock dates the loss: the expiry it counted down since it published it.
    left = will_read[4]
    assert left is not None
    since_kill = time.monotonic() - killed
    assert WILL_EXPIRY - left <= since_kill + 1, (left, since_kill)
    # A look dates it the same way, not by the connect time the will's emitted_at says.
    agents = look(procs)
    shown = agents[str(spec)]
    assert shown["status"] == "INACTIVE"
    assert shown["down_for_at_most"] is False
    assert shown["down_for_s"] <= time.monotonic() - killed + 2


async def _routed(procs: FleetProcesses) -> None:
    async with OperatorConsole(procs.operator_config) as console:
        await until_routed(console)


def statuses_of(attacker: Attacker, agent: UUID) -> list[Captured]:
    wanted = {topics.status(agent), topics.presence(agent)}
    return [c for c in attacker.captured() if c.topic in wanted and c.payload]


def test_replayed_heartbeats_of_a_dead_agent_make_no_view_or_master_take_it_active(
    procs: FleetProcesses,
) -> None:
    attacker = Attacker(procs.broker_dir.port)
    try:
        asyncio.run(_replayed_after_death(procs, attacker))
    finally:
        attacker.close()


async def _replayed_after_death(procs: FleetProcesses, attacker: Attacker) -> None:
    ids = {a.name: a.id for a in procs.fleet}
    spec, coord = ids["spec_a"], ids["coord"]
    async with OperatorConsole(procs.operator_config) as console:
        await until_routed(console)
        await until_beats(attacker, spec, 3)  # three heartbeats captured
        procs.agents["spec_b"].stop()  # the sibling stops: only spec_a could serve analyze
        procs.agents["spec_a"].kill()
        captured = [
            c for c in statuses_of(attacker, spec) if b"VM_CONNECTION_LOST" not in c.payload
        ]
        assert len(captured) >= 4
        # The attacker clears what the broker kept, and the coordinator starts afresh.
        for topic in (topics.status(spec), topics.presence(spec)):
            attacker.publish(topic, b"", retain=True)
        procs.agents["coord"].stop()
        restarted = time.monotonic()
        procs.agents["coord"].start()
        # A heartbeat younger than stale_after intervals plus the skew still reads as current
        # (docs/security.md, F23: what remains): replay only what is older than that.
        last = max(datetime.fromisoformat(json.loads(c.payload)["emitted_at"]) for c in captured)
        stale = last + timedelta(seconds=STALE_AFTER * BEAT + SKEW + 1.5)
        await asyncio.sleep(max(2.0, (stale - datetime.now(UTC)).total_seconds()))
        # Replay every captured heartbeat live, the newest retained, until 3 s after the
        # newest has left the window + skew: within the window at first (aged by emitted_at:
        # stale), then past it (refused).
        newest = {c.topic: c for c in captured}
        replaying = datetime.now(UTC)
        inside = (last + timedelta(seconds=WINDOW + SKEW) - replaying).total_seconds()
        until = time.monotonic() + max(inside, 0.0) + 3
        while time.monotonic() < until:
            for c in captured:
                attacker.publish(c.topic, c.payload, user_properties=c.user_properties)
            for c in newest.values():
                attacker.publish(c.topic, c.payload, user_properties=c.user_properties, retain=True)
            await asyncio.sleep(0.2)
        # Its master never advertised it again, a fresh look shows it not ACTIVE, and a
        # command finds no route instead of waiting for a dead agent.
        after = [
            json.loads(c.payload)
            for c in attacker.captured()
            if c.topic == topics.status(coord) and c.payload
        ]
        fresh = [m for m in after if m["details"]["started_at"] > now_iso_at(restarted)]
        assert fresh, "the restarted coordinator published its status"
        # What the restarted master advertised once the replays had begun. Before them, its
        # persistent session's backlog (spec_a's last genuine heartbeats, then its will) can
        # show spec_a alive for one beat on a loaded machine: that is no replay, and no
        # replay may bring it back (docs/security.md, F23).
        during = [
            m["details"]
            for m in fresh
            if datetime.fromisoformat(m["emitted_at"]) > replaying + timedelta(seconds=1)
        ]
        assert during, "the restarted coordinator published no status during the replays"
        assert all("analyze" not in d.get("commands", []) for d in during)
        entry = console.view.get(spec)
        assert entry is None or entry.status != "ACTIVE"
        shown = look(procs).get(str(spec))
        assert shown is None or shown["status"] != "ACTIVE", shown
        with pytest.raises(CommandFailed) as failed:
            await console.send_command("analyze", {"target": "x.pdf"}, wait=30)
        assert failed.value.code in ("NO_ROUTE", "TARGET_INACTIVE"), failed.value


async def until_beats(attacker: Attacker, agent: UUID, beats: int, timeout: float = 30) -> None:
    """Return once the attacker has captured that many heartbeats of the agent (presence)."""

    def captured() -> int:
        return sum(
            1
            for c in statuses_of(attacker, agent)
            if c.topic == topics.presence(agent) and details(c.payload).get("status") == "ACTIVE"
        )

    async with asyncio.timeout(timeout):
        while True:
            if captured() >= beats:
                return
            await asyncio.sleep(0.05)


def now_iso_at(monotonic: float) -> str:
    """Return the wall-clock ISO time of a monotonic instant (for started_at comparisons)."""
    ago = time.monotonic() - monotonic
    return (datetime.now(UTC) - timedelta(seconds=ago + 1)).isoformat(timespec="milliseconds")


def test_a_replayed_older_status_makes_its_agent_republish_at_most_once_per_interval(
    procs: FleetProcesses,
) -> None:
    attacker = Attacker(procs.broker_dir.port)
    try:
        spec = procs.fleet.agent("spec_b").id
        wait_until(lambda: len(statuses_of(attacker, spec)) >= 2, 20, "spec_b's beats")
        old = next(c for c in statuses_of(attacker, spec) if c.topic == topics.status(spec))
        procs.agents["spec_b"].stop()
        procs.agents["spec_b"].start()  # a new epoch: the captured one is older
        wait_until(
            lambda: any(details(c.payload).get("epoch") == 2 for c in statuses_of(attacker, spec)),
            30,
            "the new epoch",
        )
        before = len(statuses_of(attacker, spec))
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # 20 replays a second
            attacker.publish(old.topic, old.payload, user_properties=old.user_properties)
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        time.sleep(0.5)
        own = [
            c
            for c in statuses_of(attacker, spec)[before:]
            if c.topic == topics.status(spec) and details(c.payload).get("epoch") == 2
        ]
        # Heartbeats (one a second) plus at most one answer a second; 60 without the bound.
        assert len(own) <= 2 * (elapsed + 1.5), (len(own), elapsed)
    finally:
        attacker.close()


def test_a_leaf_posing_as_the_root_is_refused_and_shown_under_its_master(
    procs: FleetProcesses,
) -> None:
    attacker = Attacker(procs.broker_dir.port)
    try:
        asyncio.run(_posing(procs, attacker))
    finally:
        attacker.close()


async def _posing(procs: FleetProcesses, attacker: Attacker) -> None:
    ids = {a.name: a.id for a in procs.fleet}
    spec, coord = ids["spec_a"], ids["coord"]
    await _routed(procs)
    # The compromised leaf: its own login and key, its daemon out of the way.
    procs.agents["spec_a"].stop()
    daemon = load_daemon_config(procs.agents["spec_a"].config)
    config = daemon.agent_config(procs.agents["spec_a"].config.parent)
    report = AgentStatus(
        name="root",
        status="ACTIVE",
        epoch=99,
        started_at=now_iso(),
        heartbeat_interval=1.0,
        commands=["analyze"],
        sequence=1,
    )
    forged = new_message(
        MSG_AGENT_STATUS, source=spec, target=procs.fleet.operator_id, details=report
    )
    async with Session(config.broker, subscriptions=[]) as session:
        await session.publish(topics.status(spec), dump(forged), retain=True)
        presence = new_message(MSG_AGENT_STATUS, source=spec, target=spec, details=report)
        await session.publish(topics.presence(spec), dump(presence), retain=True)
    agents = look(procs)
    roots = [a for a in agents.values() if a["name"] == "root"]
    assert len(roots) == 1
    assert roots[0]["id"] == str(ids["root"])
    leaf = agents[str(spec)]
    assert leaf["name"] == "spec_a"
    assert leaf["master_id"] == str(coord)
    assert leaf["rejected"]
    assert "claims the name 'root'" in leaf["rejected"]
    # Its master posts it as misbehaving in the war room.

    def posted() -> bool:
        return any(
            c.topic == topics.warroom(coord, spec)
            and c.payload
            and details(c.payload).get("error_code") == "CHILD_MISBEHAVING"
            for c in attacker.captured()
        )

    wait_until(posted, 20, "the coordinator's CHILD_MISBEHAVING post")
