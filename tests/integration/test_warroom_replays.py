"""A replayed war-room post: a resolved incident never shows open again (docs/security.md).

An identity with the broker's power captures a genuine signed "open" post and publishes it
again after the incident was resolved, retained and not. Within the replay window every
watcher that took the resolution ignores it (not newer); after the window every reader,
even a look that connects afterwards and gets only the replayed retained copy, refuses it
STALE and counts it. A genuine incident open for longer than the window stays shown: its
poster re-posts it within the window.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.kits.attackerkit import (
    ATTACKER,
    ATTACKER_PASSWORD,
    Attacker,
    Captured,
    add_attacker,
    target_fleet,
)
from tests.kits.faultkit import run_vox
from tests.kits.fleetproc import FleetProcesses, run_fleet, wait_for_route, wait_until
from tests.kits.promkit import Exporter, run_exporter, sample
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import parse_timestamp

pytestmark = pytest.mark.slow

WINDOW = 6.0  # the fleet's replay_window, short enough to outlive in a test
SKEW = 1.0  # the clock skew every reader allows on top of it (one host here)


def allow_skew(procs: FleetProcesses) -> None:
    """Set clock_skew in every [signing] table: the daemons' and the operator's."""
    for config in [*(a.config for a in procs.agents.values()), procs.operator_config]:
        text = config.read_text()
        assert f"replay_window = {WINDOW}" in text, text
        config.write_text(text.replace("[signing]", f"[signing]\nclock_skew = {SKEW}", 1))


def open_post(attacker: Attacker, topic: str) -> Captured:
    """Return the first genuine open post the attacker captured on a war-room topic."""
    for seen in attacker.captured():
        resolved = seen.payload and json.loads(seen.payload)["details"].get("resolved")
        if seen.topic == topic and seen.payload and not resolved:
            return seen
    raise AssertionError(f"no open post captured on {topic}")


def age_of(captured: Captured) -> float:
    emitted = json.loads(captured.payload)["emitted_at"]
    return time.time() - parse_timestamp(emitted).timestamp()


def retained_on_broker(port: int, topic: str) -> bytes:
    """Read the retained message on a topic as an independent raw client (the witness)."""
    got: list[bytes] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{ATTACKER}-witness")
    client.username_pw_set(ATTACKER, ATTACKER_PASSWORD)
    client.on_message = lambda _c, _u, m: got.append(bytes(m.payload))
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        wait_until(client.is_connected, 10, "the witness connected")
        client.subscribe(topic, qos=1)
        wait_until(lambda: bool(got), 10, f"the retained message on {topic}")
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0]


def warroom_look(procs: FleetProcesses) -> list[dict[str, Any]]:
    """Run `vox warroom --json` as a look that connects now; return its open incidents."""
    out = run_vox("warroom", "--config", procs.operator_config, "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def opened_about(rows: list[dict[str, Any]], source: UUID, subject: UUID) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if r.get("source") == str(source)
        and r.get("subject") == str(subject)
        and not r.get("resolved")
    ]


def test_a_replayed_open_post_never_reopens_a_resolved_incident(tmp_path: Path) -> None:
    with run_fleet(
        tmp_path, target_fleet("require", WINDOW), start=False, before_broker=add_attacker
    ) as procs:
        allow_skew(procs)
        procs.start_all()
        ids = {spec.name: spec.id for spec in procs.fleet}
        attacker = Attacker(procs.broker_dir.port)
        try:
            # The exporter reads what the operator reads, and counts what it did not take.
            with run_exporter(procs.operator_config, tmp_path / "exporter.log") as exporter:
                asyncio.run(replays(procs, attacker, ids, exporter))
        finally:
            attacker.close()


async def until(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    try:
        async with asyncio.timeout(timeout):
            while True:
                if predicate():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def wait_incident(console: OperatorConsole, key: tuple[UUID, UUID], *, open_: bool) -> None:
    shown = lambda: any(i.key == key for i in console.agent.incidents) == open_  # noqa: E731
    await until(shown, f"{key} {'open' if open_ else 'resolved'} in the console")


def logged(procs: FleetProcesses, name: str, text: str, count: int = 1) -> Callable[[], bool]:
    """Return a predicate: the agent's log holds text at least count times."""
    return lambda: procs.agents[name].log().count(text) >= count


def stale_count(console: OperatorConsole) -> int:
    """The STALE rejections the console counted (vox_agent_rejected_total{reason="STALE"})."""
    return int(console.agent.metrics.rejected.values.get("STALE", 0))


def scraped_replays(exporter: Exporter, reason: str) -> float | None:
    """Scrape the exporter: vox_warroom_replays_total for one reason."""
    return sample(exporter.samples(), "vox_warroom_replays_total", reason=reason)


async def replays(
    procs: FleetProcesses, attacker: Attacker, ids: dict[str, UUID], exporter: Exporter
) -> None:
    coord, spec_a, spec_b = ids["coord"], ids["spec_a"], ids["spec_b"]
    key = (coord, spec_a)
    topic = topics.warroom(coord, spec_a)
    # The operator's view: every status and the war room, as `vox console` watches them.
    observe = [topics.STATUS_FILTER, topics.WARROOM_FILTER]
    async with OperatorConsole(procs.operator_config, observe=observe) as console:
        await wait_for_route(console, "analyze")
        for name in ("spec_a", "spec_b"):  # coord watches both before one is killed
            line = f"coord: {name} UNKNOWN -> ACTIVE"
            await until(logged(procs, "coord", line), line)
        # A genuine incident, opened and resolved: spec_a killed, then started again.
        procs.agents["spec_a"].kill()
        await wait_incident(console, key, open_=True)
        captured = open_post(attacker, topic)
        procs.agents["spec_a"].start()
        await wait_incident(console, key, open_=False)
        assert age_of(captured) < WINDOW, "the resolution took longer than the window"

        # 1. Within the window: the open post again, live and retained.
        for retain in (False, True):
            attacker.publish(
                topic, captured.payload, user_properties=captured.user_properties, retain=retain
            )
        # A real round trip after them: both were judged by now.
        after = await console.send_command("analyze", {"target": "after.pdf"}, wait=30)
        assert after.details["result"]["target"] == "after.pdf"
        assert not any(i.key == key for i in console.agent.incidents)
        # The root's view: both ignored, neither taken (its log says which, at INFO).
        ignored = "war room: ignored a post: NOT_NEWER"
        await until(logged(procs, "root", ignored, 2), "the root ignoring both replays")
        assert "refused a post" not in procs.agents["root"].log()
        # The exporter took the resolution too: both ignored, counted, none refused yet.
        await until(
            lambda: (scraped_replays(exporter, "NOT_NEWER") or 0) >= 2, "the exporter's NOT_NEWER"
        )
        assert scraped_replays(exporter, "STALE") == 0

        # 2. After the window: refused STALE by every reader, even one that connects now
        # and gets only the replayed retained copy from the broker.
        await asyncio.sleep(max(0.0, WINDOW + SKEW + 0.5 - age_of(captured)))
        before = stale_count(console)
        for retain in (False, True):
            attacker.publish(
                topic, captured.payload, user_properties=captured.user_properties, retain=retain
            )
        assert retained_on_broker(procs.broker_dir.port, topic) == captured.payload
        await until(lambda: stale_count(console) >= before + 2, "the console's STALE")
        refused = "war room: refused a post: STALE: emitted"
        await until(logged(procs, "root", refused, 2), "the root's STALE")
        await until(lambda: (scraped_replays(exporter, "STALE") or 0) >= 2, "the exporter's STALE")
        assert not any(i.key == key for i in console.agent.incidents)
        assert opened_about(warroom_look(procs), coord, spec_a) == []

        # 3. A genuine incident open for longer than the window stays shown: re-posted.
        procs.agents["spec_b"].kill()
        await wait_incident(console, (coord, spec_b), open_=True)
        await asyncio.sleep(2 * (WINDOW + SKEW))
        assert len(opened_about(warroom_look(procs), coord, spec_b)) == 1
        assert any(i.key == (coord, spec_b) for i in console.agent.incidents)
        procs.agents["spec_b"].start()
        await wait_incident(console, (coord, spec_b), open_=False)
