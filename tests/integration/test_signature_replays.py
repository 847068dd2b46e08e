"""Replays a signature cannot tell from the original: by age, and statuses older than the last.

An identity with the broker's power captures genuine signed traffic and replays it later
(docs/security.md, replays). A captured command older than the replay window is refused
STALE, even by a target whose ledger never saw it; a genuine message is either delivered
within the window or ended at its sender, never refused silently. A captured older status
of a live agent is ignored by every watcher.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from pathlib import Path
from uuid import UUID

import pytest

from tests.kits.attackerkit import (
    Attacker,
    Captured,
    add_attacker,
    command_capture,
    ledger,
    target_fleet,
    wait_rejected,
    wait_view,
)
from tests.kits.fleetproc import FleetProcesses, run_fleet, wait_for_route, wait_until
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.observe.status import ACTIVE, STALE
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import parse_timestamp
from vox_mqtt.protocol.topics import STATUS_FILTER

pytestmark = pytest.mark.slow

WINDOW = 6.0  # the fleet's replay_window, short enough to outlive in a test
SKEW = 1.0  # the clock skew each agent allows on top of it (one host here)


def allow_skew(procs: FleetProcesses, skew: float) -> None:
    """Set each daemon's clock_skew in its [signing] table (docs/security.md)."""
    for agent in procs.agents.values():
        text = agent.config.read_text()
        assert "replay_window = 6.0" in text, text
        agent.config.write_text(text.replace("[signing]", f"[signing]\nclock_skew = {skew}", 1))


def age_of(captured: Captured) -> float:
    emitted = json.loads(captured.payload)["emitted_at"]
    return time.time() - parse_timestamp(emitted).timestamp()


def started(procs: FleetProcesses, name: str, message_id: str) -> list[str]:
    return [
        r["action"]
        for r in ledger(procs, name)
        if r["message_id"] == message_id and r["action"] in ("started", "completed")
    ]


def freeze(procs: FleetProcesses, names: list[str]) -> None:
    for name in names:
        procs.agents[name].signal(signal.SIGSTOP)


def thaw(procs: FleetProcesses, names: list[str]) -> None:
    for name in names:
        procs.agents[name].signal(signal.SIGCONT)


def test_replays_older_than_the_window_are_stale_and_genuine_messages_never_are(
    tmp_path: Path,
) -> None:
    # keepalive 30: a specialist frozen for a few seconds keeps its connection (no will).
    with run_fleet(
        tmp_path,
        target_fleet("require", WINDOW),
        keepalive=30,
        start=False,
        before_broker=add_attacker,
    ) as procs:
        allow_skew(procs, SKEW)
        procs.start_all()
        ids = {spec.name: spec.id for spec in procs.fleet}
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(by_age(procs, attacker, ids))
        finally:
            attacker.close()


async def by_age(procs: FleetProcesses, attacker: Attacker, ids: dict[str, UUID]) -> None:
    specs = ["spec_a", "spec_b"]
    async with OperatorConsole(procs.operator_config) as console:
        await wait_for_route(console, "analyze")
        first = await console.send_command("analyze", {"target": "first.pdf"}, wait=120)
        assert first.details["result"]["target"] == "first.pdf"
        captured, spec, _ = command_capture(attacker, ids)
        command_id = json.loads(captured.payload)["message_id"]

        # 1. A genuine outage shorter than the window: the command waits and is served.
        freeze(procs, specs)
        pending = asyncio.create_task(
            console.send_command("analyze", {"target": "short.pdf"}, wait=60)
        )
        await asyncio.sleep(WINDOW / 2)
        thaw(procs, specs)
        short = await pending
        assert short.details["result"]["target"] == "short.pdf"

        # 2. The target starts again from an empty state directory: its ledger (and dedupe
        # index) never saw the captured command, whose deadline has not passed.
        procs.agents[spec].stop()
        shutil.move(procs.agents[spec].state_dir, procs.root / f"{spec}-old-state")
        procs.agents[spec].start()
        await wait_for_route(console, "analyze")
        await asyncio.sleep(max(0.0, WINDOW + SKEW + 0.5 - age_of(captured)))
        attacker.publish(captured.topic, captured.payload, user_properties=captured.user_properties)
        reasons = await asyncio.to_thread(wait_rejected, procs, spec, 1)
        assert reasons[0].startswith("STALE: emitted"), reasons
        assert "older than the replay window (6 s" in reasons[0], reasons
        assert started(procs, spec, command_id) == []  # no handler ran for it

        # 3. A genuine outage longer than the window: the coordinator stops re-sending at
        # the window and ends it failed (a ledger row); the caller hears why. The copies
        # that waited for the frozen specialist are refused STALE when it wakes.
        freeze(procs, specs)
        try:
            with pytest.raises(CommandFailed) as failed:
                await console.send_command("analyze", {"target": "long.pdf"}, wait=60)
        finally:
            await asyncio.sleep(SKEW + 0.5)
            thaw(procs, specs)
        assert failed.value.code == "DELIVERY_FAILED", failed.value
        assert "older than the replay window" in failed.value.error
        ends = [
            r
            for r in ledger(procs, "coord")
            if r["action"] == "failed" and "replay window" in str(r["reason"])
        ]
        assert len(ends) == 1, ends
        downstream = ends[0]["message_id"]

        def stale_at() -> list[str]:
            return [
                name
                for name in specs
                for r in ledger(procs, name)
                if r["message_id"] == downstream
                and r["action"] == "rejected"
                and str(r["reason"]).startswith("STALE")
            ]

        await asyncio.to_thread(wait_until, stale_at, 20, "the late copies refused STALE")
        [target] = set(stale_at())  # the one it was delegated to
        assert started(procs, target, downstream) == []
        # Real traffic goes on.
        after = await console.send_command("analyze", {"target": "after.pdf"}, wait=30)
        assert after.details["result"]["target"] == "after.pdf"


def test_a_replayed_older_status_of_a_live_agent_is_ignored(tmp_path: Path) -> None:
    text = target_fleet("require")
    with run_fleet(tmp_path, text, keepalive=30, before_broker=add_attacker) as procs:
        ids = {spec.name: spec.id for spec in procs.fleet}
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(older_status(procs, attacker, ids["spec_a"]))
        finally:
            attacker.close()


async def older_status(procs: FleetProcesses, attacker: Attacker, agent: UUID) -> None:
    async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
        await wait_for_route(console, "analyze")
        await wait_view(console, agent, ACTIVE)
        status, presence = topics.status(agent), topics.presence(agent)
        await asyncio.sleep(3)  # a few heartbeats later
        seen = attacker.captured()
        old = [next(c for c in seen if c.topic == t and c.payload) for t in (status, presence)]
        newest = [next(c for c in reversed(seen) if c.topic == t) for t in (status, presence)]
        old_emitted = json.loads(old[0].payload)["emitted_at"]
        entry = console.view.get(agent)
        assert entry is not None
        assert entry.last_heartbeat > old_emitted

        # The agent stops heartbeating (frozen, still connected); the attacker replays its
        # older statuses, and its newest, again and again: none is news to any watcher.
        # Frozen until both watchers said so: each judges on its own tick, and a thaw after
        # the console's STALE alone lets its next real heartbeat reach the master first.
        def coord_saw() -> bool:  # its master logs the change, the replays notwithstanding
            return "spec_a ACTIVE -> STALE" in procs.agents["coord"].log()

        procs.agents["spec_a"].signal(signal.SIGSTOP)
        try:
            async with asyncio.timeout(20):
                while entry.status != STALE or not coord_saw():
                    for replay in (*old, *newest):
                        attacker.publish(
                            replay.topic, replay.payload, user_properties=replay.user_properties
                        )
                    assert entry.last_heartbeat > old_emitted, "an older heartbeat was taken"
                    await asyncio.sleep(0.3)
        finally:
            procs.agents["spec_a"].signal(signal.SIGCONT)
        await wait_view(console, agent, ACTIVE)  # and its next real heartbeat is taken
