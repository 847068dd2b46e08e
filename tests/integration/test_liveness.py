"""Liveness duties of in-process agents on the fleet's real broker, and the observer's rules."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.kits.agentkit import Analyst, agent_config, start_agents, wait_for
from tests.kits.brokerkit import Client, Received, SecureBroker, Witness, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.reconcile import CATCH_UP
from vox_mqtt.agent.rules import choose_child
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import FleetView
from vox_mqtt.observe.warroom import loss_code
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    ErrorCode,
    new_message,
    serialize,
)
from vox_mqtt.transport.session import Inbound

SEED = {"root": None, "coordinator": "root", "spec_a": "coordinator", "spec_b": "coordinator"}
METRICS = {"cpu_percent", "memory_percent", "disk_percent", "load_1m", "process_rss_bytes"}


@pytest.fixture
def secure(secure_broker_factory: Any) -> SecureBroker:
    # Its tests fake late wills with a second connection of one identity: unlocked ids.
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED), lock_client_ids=False)
    return broker


@pytest.fixture
def explorer(secure: SecureBroker) -> Any:
    client = Client(secure.creds("explorer"))
    assert client.connect() == 0
    client.subscribe([*topics.LIVENESS_FILTERS, topics.WARROOM_FILTER])
    yield client
    client.close()


def statuses(client: Client, agent: UUID, *, presence: bool = False) -> list[dict[str, Any]]:
    topic = topics.presence(agent) if presence else topics.status(agent)
    return [
        json.loads(m.payload)["details"]
        for m in list(client.messages)
        if m.topic == topic and m.payload
    ]


def last(client: Client, agent: UUID, key: str, *, presence: bool = False) -> Any:
    """Return one field of the latest status (or presence) of agent, or None before the first."""
    seen = statuses(client, agent, presence=presence)
    return seen[-1][key] if seen else None


def posts(client: Client, source: UUID, subject: UUID) -> list[Received]:
    return [m for m in list(client.messages) if m.topic == topics.warroom(source, subject)]


def kinds(client: Client, source: UUID, subject: UUID) -> list[Any]:
    """Return each war-room message about subject: False open, True resolved, "clear"."""
    return [
        "clear" if not m.payload else json.loads(m.payload)["details"]["resolved"]
        for m in posts(client, source, subject)
    ]


async def until(client: Client, predicate: Any, timeout: float = 10.0) -> None:
    met = await asyncio.to_thread(client.wait_for, lambda _: predicate(), timeout)
    assert met, [(m.topic, m.payload[:300]) for m in list(client.messages)][-12:]


async def test_birth_heartbeats_shutdown_will_and_epochs(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    spec = secure.fleet.agent("spec_a").id
    config = agent_config(secure, "spec_a", tmp_path, heartbeat_interval=0.2)
    async with VOXAgent(config, [Analyst()]):
        await until(explorer, lambda: len(statuses(explorer, spec)) >= 3)
    first = statuses(explorer, spec)
    birth, beat, shutdown = first[0], first[1], first[-1]
    # A running agent's full status names no state: the presence tells (docs/liveness.md).
    assert ("status" in birth, birth["epoch"], birth["commands"]) == (False, 1, ["analyze"])
    assert birth["heartbeat_interval"] == 0.2
    assert set(birth["metrics"]) >= METRICS
    assert ("status" in beat, beat["epoch"], beat["started_at"]) == (False, 1, birth["started_at"])
    assert (shutdown["status"], shutdown["error_code"], shutdown["epoch"]) == (
        "INACTIVE",
        "SHUTDOWN",
        1,
    )
    assert (tmp_path / "spec_a" / "epoch").read_text().strip() == "1"
    # The presence: the same liveness, addressed to itself, naming no master and no command.
    alive = [m for m in list(explorer.messages) if m.topic == topics.presence(spec)]
    assert alive
    assert {json.loads(m.payload)["target"] for m in alive} == {str(spec)}
    shown = [json.loads(m.payload)["details"] for m in alive]
    assert shown[0]["status"] == "ACTIVE"
    assert shown[-1]["error_code"] == "SHUTDOWN"
    assert all(
        p["commands"] == [] and p["metrics"] == {} and p.get("ledger_head") is None for p in shown
    )

    explorer.messages.clear()
    agent = VOXAgent(config, [Analyst()])
    await agent.__aenter__()
    try:
        await until(explorer, lambda: len(statuses(explorer, spec)) >= 1)
        assert agent.session is not None
        await agent.session.disconnect_abruptly()  # a crash: the broker publishes the will
        await until(explorer, lambda: last(explorer, spec, "status", presence=True) == "INACTIVE")
    finally:
        await agent.stop()
    will = statuses(explorer, spec, presence=True)[-1]
    assert (will["error_code"], will["epoch"], will["commands"]) == ("VM_CONNECTION_LOST", 2, [])
    # It says what its time is: set at connect, published by the broker at death.
    assert "set at connect" in will["detail"]


async def test_a_lost_child_is_one_incident_resolved_when_it_is_back(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    fleet = secure.fleet
    coord, spec = fleet.agent("coordinator").id, fleet.agent("spec_a").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack,
            secure,
            tmp_path,
            {"spec_a": [Analyst()]},
            ["coordinator", "spec_a"],
            heartbeat_interval=0.5,
        )
        coordinator = agents["coordinator"]
        await wait_for(lambda: coordinator.advertised_commands() == ["analyze"])
        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False])
        await wait_for(lambda: coordinator.advertised_commands() == [])
        await asyncio.sleep(1.5)  # three heartbeats later, still one post
        assert kinds(explorer, coord, spec) == [False]
        post = json.loads(posts(explorer, coord, spec)[0].payload)
        assert post["target"] == "00000000-0000-4000-8000-000000000911"
        assert (post["details"]["error_code"], post["details"]["epoch"]) == (
            "VM_CONNECTION_LOST",
            1,
        )
        opened = json.loads((tmp_path / "coordinator" / "incidents.json").read_text())
        assert opened == {str(spec): "VM_CONNECTION_LOST"}

        config = agent_config(secure, "spec_a", tmp_path, heartbeat_interval=0.5)
        await stack.enter_async_context(VOXAgent(config, [Analyst()]))
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False, True, "clear"])
        await wait_for(lambda: coordinator.advertised_commands() == ["analyze"])
        incidents = tmp_path / "coordinator" / "incidents.json"
        await wait_for(lambda: json.loads(incidents.read_text()) == {})


async def test_a_graceful_stop_is_no_incident(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    fleet = secure.fleet
    coord, spec = fleet.agent("coordinator").id, fleet.agent("spec_b").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack, secure, tmp_path, {}, ["coordinator", "spec_b"], heartbeat_interval=0.5
        )
        await agents["spec_b"].stop()
        await wait_for(lambda: agents["coordinator"].fleet_view.get(spec).status == "INACTIVE")  # type: ignore[union-attr]
        # The coordinator reacts to the change before its next heartbeats go out, and the
        # broker keeps one client's messages in order: two later heartbeats seen by the
        # explorer prove any post about spec_b would have arrived already.
        before = len(statuses(explorer, coord))
        assert await asyncio.to_thread(
            explorer.wait_for, lambda _: len(statuses(explorer, coord)) >= before + 2, 10.0
        )
    assert posts(explorer, coord, spec) == []


async def test_an_incident_outlives_its_master_restart_and_is_resolved_after_it(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    fleet = secure.fleet
    coord, spec = fleet.agent("coordinator").id, fleet.agent("spec_a").id
    fast = {"heartbeat_interval": 0.5}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, ["coordinator", "spec_a"], **fast)
        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False])
        await agents["coordinator"].stop()
    # The child comes back while its master is away; the master resolves on its return.
    async with AsyncExitStack() as stack:
        await start_agents(stack, secure, tmp_path, {}, ["spec_a"], **fast)
        await start_agents(stack, secure, tmp_path, {}, ["coordinator"], **fast)
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False, True, "clear"])


async def test_a_misbehaving_child_held_back_by_the_grace_leaves_its_loss_owned(
    secure: SecureBroker, explorer: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short misbehaving hold, so that it runs out within the master's reconnect grace
    # (here reconnect_max, 30 s), as the 60 s hold does for children beating slower than
    # every 20 s (three intervals of grace).
    monkeypatch.setattr("vox_mqtt.observe.status.MISBEHAVING_HOLD", 2.0)
    fleet = secure.fleet
    coord, spec = fleet.agent("coordinator").id, fleet.agent("spec_a").id
    incidents = tmp_path / "coordinator" / "incidents.json"
    fast = {"heartbeat_interval": 0.5}
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, ["coordinator", "spec_a"], **fast)
        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False])
        await agents["coordinator"].stop()
    async with AsyncExitStack() as stack:
        # The master is back; the child's will is retained news, so within the grace a
        # status out of bounds may not replace the loss with a CHILD_MISBEHAVING post.
        agents = await start_agents(stack, secure, tmp_path, {}, ["coordinator"], **fast)
        coordinator = agents["coordinator"]
        await wait_for(lambda: coordinator.fleet_view.get(spec) is not None)
        intruder = Client(secure.creds("spec_a"), client_id=f"{spec}-x")
        assert intruder.connect() == 0
        forged = status_of(spec, "ACTIVE", 5000, []).model_copy(update={"target": coord})
        assert (
            await asyncio.to_thread(intruder.publish, topics.status(spec), serialize(forged)) == 0
        )
        intruder.close()
        await wait_for(lambda: coordinator.fleet_view.get(spec).rejected is not None)  # type: ignore[union-attr]
        # It reacts to the refusal before its next two heartbeats (see the graceful-stop test).
        before = len(statuses(explorer, coord))
        await until(explorer, lambda: len(statuses(explorer, coord)) >= before + 2)
        # The loss post is still retained on the topic, so it is still owned.
        assert kinds(explorer, coord, spec) == [False]
        assert json.loads(incidents.read_text()) == {str(spec): "VM_CONNECTION_LOST"}
        # The child is back and the hold runs out: the post is resolved and cleared.
        await start_agents(stack, secure, tmp_path, {}, ["spec_a"], **fast)
        await until(explorer, lambda: kinds(explorer, coord, spec) == [False, True, "clear"])
        await wait_for(lambda: json.loads(incidents.read_text()) == {})


async def test_host_checks_post_one_incident_and_resolve_it_when_they_pass(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    spec = secure.fleet.agent("spec_b").id
    low = {"heartbeat_interval": 0.2, "disk_alert_percent": 0.01, "memory_alert_percent": 0.01}
    async with VOXAgent(agent_config(secure, "spec_b", tmp_path, **low)):
        await until(explorer, lambda: kinds(explorer, spec, spec) == [False])
        await asyncio.sleep(0.6)
    assert kinds(explorer, spec, spec) == [False]
    details = json.loads(posts(explorer, spec, spec)[0].payload)["details"]
    assert (details["error_code"], details["severity"]) == ("DISK_FULL", "ERROR")
    assert "disk_percent" in details["description"]
    assert "memory_percent" in details["description"]
    sane = {"heartbeat_interval": 0.2, "disk_alert_percent": 100.0, "memory_alert_percent": 100.0}
    async with VOXAgent(agent_config(secure, "spec_b", tmp_path, **sane)):
        await until(explorer, lambda: kinds(explorer, spec, spec) == [False, True, "clear"])


# --- rules without a broker --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status_of(agent: UUID, state: str, epoch: int, commands: list[str], **extra: Any) -> Any:
    report = AgentStatus(
        name=str(agent)[:8],
        status=state,
        epoch=epoch,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        commands=commands,
        **extra,
    )
    return new_message(MSG_AGENT_STATUS, source=agent, target=uuid4(), details=report)


def test_routing_prefers_healthy_children_and_names_stale_ones_target_inactive(
    secure: SecureBroker,
) -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    a, b = (secure.fleet.agent(n).id for n in ("spec_a", "spec_b"))
    coordinator = secure.fleet.agent("coordinator").id

    def choose(command: str) -> tuple[UUID | None, ErrorCode | None]:
        return choose_child(command, [view.get(a), view.get(b)], load={})

    view.update(status_of(a, "ACTIVE", 1, ["analyze", "echo"]))
    view.update(status_of(b, "ACTIVE", 1, ["analyze"]))
    clock.now += 2.0
    view.update(status_of(b, "ACTIVE", 1, ["analyze"]))
    clock.now += 1.5  # a's last heartbeat is 3.5 intervals old, b's 1.5
    view.refresh()
    assert view.get(a).status == "STALE"  # type: ignore[union-attr]
    assert [choose("analyze") for _ in range(20)] == [(b, None)] * 20
    # A stale child still lists its commands but is no route: TARGET_INACTIVE.
    assert choose("echo") == (None, ErrorCode.TARGET_INACTIVE)
    assert view.commands_of([a, b]) == {"analyze"}
    # A child whose will arrived lists nothing, but it served the command: it is down,
    # not unknown (REQ-001-US-002-008); a command nobody served has no route at all.
    view.update(status_of(a, "INACTIVE", 1, [], error_code="VM_CONNECTION_LOST"))
    assert choose("echo") == (None, ErrorCode.TARGET_INACTIVE)
    assert choose("nonesuch") == (None, ErrorCode.NO_ROUTE)
    assert loss_code(view.get(a)) == "VM_CONNECTION_LOST"  # type: ignore[arg-type]
    assert [c.id for c in view.get_children(coordinator)] == []


def inbound(topic: str, payload: bytes, *, retain: bool = False) -> Inbound:
    return Inbound(topic=topic, payload=payload, retain=retain)


def test_the_observer_keeps_statuses_and_open_incidents_and_ignores_forgeries() -> None:
    observer = FleetObserver()
    agent, master, forger = uuid4(), uuid4(), uuid4()
    birth = status_of(agent, "ACTIVE", 3, ["analyze"]).model_copy(update={"target": master})
    observer.take(inbound(f"vox/{agent}/status", serialize(birth), retain=True))
    observer.take(inbound(f"vox/{forger}/status", serialize(birth)))  # someone else's status
    observer.take(inbound("vox/not-a-uuid/status", b"{}"))
    observer.take(inbound(f"vox/{agent}/status", b""))  # a cleared retained status
    entry = observer.view.get(agent)
    assert entry is not None
    assert (entry.status, entry.epoch, entry.seen, entry.retained) == ("ACTIVE", 3, True, True)
    assert observer.view.get(forger) is None
    assert [c.id for c in observer.view.get_children(master)] == [agent]

    topic = f"vox/warroom/{master}/{agent}"
    seen: list[dict[str, Any]] = []
    observer.on_incident = lambda incident: seen.append(incident.as_dict())

    posted = iter(range(1, 100))

    def post(resolved: bool) -> bytes:
        details = {"error_code": "X", "severity": "CRITICAL", "description": "d"}
        details["subject"] = str(agent)
        message = new_message(
            "system_failure",
            source=master,
            target=uuid4(),
            details={**details, "resolved": resolved},
        )
        # Each post a second after the one before, as a poster's are: within one millisecond
        # a resolution counts as newer than an opening (observe/warroomreplay.py).
        at = datetime.now(UTC) + timedelta(seconds=next(posted))
        return serialize(message.model_copy(update={"emitted_at": at.isoformat()}))

    observer.take(inbound(topic, post(False), retain=True))
    assert list(observer.incidents) == [(master, agent)]
    observer.take(inbound(f"vox/warroom/{forger}/{agent}", post(False)))  # not its to post
    assert len(observer.incidents) == 1
    observer.take(inbound(topic, post(True)))
    assert observer.incidents == {}
    observer.take(inbound(topic, post(False)))
    observer.take(inbound(topic, b"", retain=True))
    assert observer.incidents == {}
    assert [row["resolved"] for row in seen] == [False, True, False]


def test_a_very_old_retained_status_is_still_seen() -> None:
    clock = Clock()
    clock.now = 5.0  # a host that booted seconds ago: the age reaches below zero
    view = FleetView(clock=clock)
    agent = uuid4()
    old = status_of(agent, "ACTIVE", 1, []).model_copy(
        update={"emitted_at": "2020-01-01T00:00:00+00:00"}
    )
    view.update(old, retained=True)
    entry = view.get(agent)
    assert entry is not None
    assert entry.seen
    assert entry.status == "STALE"
    age = entry.heartbeat_age()
    assert age is not None
    assert age > 3600


async def test_an_agent_that_reads_its_own_status_puts_its_birth_back_over_a_late_will(
    secure: SecureBroker, explorer: Client, tmp_path: Path
) -> None:
    spec = secure.fleet.agent("spec_a").id
    topic = f"vox/{spec}/presence"  # where its will lands
    config = agent_config(secure, "spec_a", tmp_path, heartbeat_interval=0.2)
    agent = VOXAgent(config)
    await agent.__aenter__()
    assert agent.session is not None
    await agent.session.disconnect_abruptly()
    await until(explorer, lambda: last(explorer, spec, "status", presence=True) == "INACTIVE")
    late_will = [m.payload for m in explorer.messages if m.topic == topic][-1]
    await agent.stop()
    # Reborn with a slow heartbeat, reading its own presence topic.
    config = agent_config(secure, "spec_a", tmp_path, heartbeat_interval=30.0, observe=(topic,))
    async with VOXAgent(config):
        await until(explorer, lambda: last(explorer, spec, "epoch", presence=True) == 2)
        seen_before = len(statuses(explorer, spec, presence=True))
        intruder = Client(secure.creds("spec_a"), client_id=f"{spec}-late")
        assert intruder.connect() == 0
        assert await asyncio.to_thread(intruder.publish, topic, late_will, retain=True) == 0
        intruder.close()

        def reborn_after_the_late_will() -> bool:
            # The agent may republish more than once (it can see old news twice); what
            # counts is an epoch-2 status after the late epoch-1 one.
            epochs = [s["epoch"] for s in statuses(explorer, spec, presence=True)][seen_before:]
            return 1 in epochs and 2 in epochs[epochs.index(1) :]

        await until(explorer, reborn_after_the_late_will)
        # A look that connects now finds the newer session's presence retained.
        fresh = Client(secure.creds("explorer"), client_id="fresh-look")
        assert fresh.connect() == 0
        fresh.subscribe([topic])
        assert await asyncio.to_thread(fresh.wait_for, lambda ms: bool(ms), 5.0)
        fresh.close()
    assert json.loads(fresh.messages[0].payload)["details"]["epoch"] == 2
    assert json.loads(fresh.messages[0].payload)["details"]["status"] == "ACTIVE"


async def coordinator_over_spec_a(
    stack: AsyncExitStack, secure: SecureBroker, tmp_path: Path
) -> dict[str, VOXAgent]:
    """Start the coordinator and its child spec_a (heartbeat 3 s); return once it serves."""
    agents = await start_agents(
        stack, secure, tmp_path, {"spec_a": [Analyst()]}, ["coordinator", "spec_a"],
        heartbeat_interval=3.0,
    )  # fmt: skip
    await wait_for(lambda: agents["coordinator"].advertised_commands() == ["analyze"])
    return agents


async def test_an_incident_decided_on_an_earlier_connection_is_not_posted_on_the_next(
    secure: SecureBroker, tmp_path: Path
) -> None:
    """docs/liveness.md: a reconcile pass awaits each post's PUBACK, so on a busy host it may
    outlast its connection (a stopping broker sends every child's will just before it
    closes the master's own). What it decided on that connection is skipped on the next,
    where liveness decides anew; decided on the connection up now, it goes out."""
    coord, spec = secure.fleet.agent("coordinator").id, secure.fleet.agent("spec_a").id
    witness = Witness(secure.creds("explorer"), "vox/warroom/#", fmt="%r %t %p", session_expiry=60)
    try:
        async with AsyncExitStack() as stack:
            agents = await coordinator_over_spec_a(stack, secure, tmp_path)
            coordinator = agents["coordinator"]
            link = coordinator.session._link  # the live connection; no public handle on purpose
            assert link is not None
            link.abort()
            await wait_for(
                lambda: coordinator.session.connection_count == 2 and coordinator.session.connected,
                timeout=20,
            )
            posts = coordinator._live().warroom.posts  # the war room it keeps (reconcile.py)
            with pytest.raises(VoxError, match="offline, war-room post skipped"):
                await posts.open_incident(
                    spec, "VM_CONNECTION_LOST", "decided before", decided_on=1
                )
            assert spec not in posts.open_codes
            await posts.open_incident(spec, "VM_CONNECTION_LOST", "decided now", decided_on=2)
            assert posts.open_codes[spec] == "VM_CONNECTION_LOST"
            await wait_for(lambda: any("decided now" in ln for ln in witness.lines), timeout=10)
        about = [ln for ln in witness.lines if f"vox/warroom/{coord}/{spec}" in ln]
        assert not any("decided before" in ln for ln in about), about
        assert any("decided now" in ln for ln in about), about
    finally:
        witness.close()


async def test_a_will_seen_within_the_grace_after_a_reconnect_is_held_and_never_posted(
    secure: SecureBroker, tmp_path: Path
) -> None:
    """docs/liveness.md, the grace after a reconnect (protocol/storm.py): after a broker
    restart the coordinator gets its child's will live past the 2 s catch-up (the child
    drops once more 2.5 s after the coordinator is back) and the child is reborn at once:
    held for the grace (window + the child's silence allowance + 2 s), never posted.
    Without the grace it is posted at once."""
    coord, spec = secure.fleet.agent("coordinator").id, secure.fleet.agent("spec_a").id
    witness = Witness(secure.creds("explorer"), "vox/warroom/#", fmt="%r %t %p", session_expiry=60)
    try:
        async with AsyncExitStack() as stack:
            agents = await coordinator_over_spec_a(stack, secure, tmp_path)
            coordinator, child = agents["coordinator"], agents["spec_a"]
            await asyncio.to_thread(secure.broker.restart)
            await wait_for(
                lambda: coordinator.session.connection_count == 2 and coordinator.session.connected,
                timeout=20,
            )
            back = time.monotonic()
            await wait_for(lambda: child.session.connection_count == 2, timeout=20)
            await asyncio.sleep(max(0.0, back + CATCH_UP + 0.5 - time.monotonic()))
            await child.session.disconnect_abruptly()  # its will, live, past the catch-up
            config = agent_config(secure, "spec_a", tmp_path, heartbeat_interval=3.0)
            await stack.enter_async_context(VOXAgent(config, [Analyst()]))
            await wait_for(lambda: coordinator.advertised_commands() == ["analyze"], timeout=10)
            # Seconds after the child is back (the grace of one heartbeat it once had is over):
            # still nothing posted.
            await asyncio.sleep(max(0.0, back + coordinator.session.reconnect_window + 6.0
                                    - time.monotonic()))  # fmt: skip
            assert coordinator.fleet_view.get(spec).status == "ACTIVE"  # type: ignore[union-attr]
        about = [ln for ln in witness.lines if f"vox/warroom/{coord}/{spec}" in ln]
        assert about == [], about
    finally:
        witness.close()
