"""F24: a compromised leaf answers its master's request to its sibling; nobody takes it.

A signed fleet (`signatures = "require"`): root -> coord -> spec_a, spec_b. spec_a is the
compromised leaf: its messages are published on its own inbox topic to coord and signed
with its own key (`spec_a.signing.toml`), byte for byte what its login may publish; the
broker-powered identity of tests/kits/attackerkit.py does the publishing and shows it the
request id coord sent spec_b. It acknowledges that request, reports progress on it and
answers it. Coord refuses all three (WRONG_ANSWERER, recorded and counted), `vox request
show` keeps saying the sibling works, and the operator gets the sibling's genuine result.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.attackerkit import Attacker, Captured, add_attacker, ledger, raw_envelope
from tests.kits.clikit import capture
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.lifecyclekit import route_up, until
from vox_mqtt.agent.plan import ANSWERS
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.config import SigningSection
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import VOXMessage
from vox_mqtt.protocol.signing import sign

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

SHAPE: dict[str, str | None] = {
    "root": None,
    "coord": "root",
    "spec_a": "coord",
    "spec_b": "coord",
}
STEPS = 12  # spec_b's `steps` reports 12 steps a second apart, then answers 12
FORGED = "forged by spec_a"


def signed_fleet(tmp: Path) -> str:
    # Only spec_b serves `steps`: the request goes to it, never to the compromised leaf.
    roles = {
        "spec_a": ["tests.kits.agentkit:Analyst"],
        "spec_b": ["tests.kits.lifecyclekit:Lifecycle"],
    }
    settings = {"spec_b": {"events_file": str(tmp / "events.txt")}}
    return 'signatures = "require"\n' + fleet_text(SHAPE, roles=roles, settings=settings)


def test_a_leaf_cannot_answer_its_siblings_request(tmp_path: Path, capture: Any) -> None:
    with run_fleet(tmp_path, signed_fleet(tmp_path), before_broker=add_attacker) as procs:
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(scenario(procs, attacker, capture))
        finally:
            attacker.close()


class Leaf:
    """spec_a, compromised: publishes what it likes on its own topics, signed with its key."""

    def __init__(self, procs: FleetProcesses, attacker: Attacker) -> None:
        keys = procs.agents["spec_a"].config.parent / "spec_a.signing.toml"
        key = SigningSection(keys_file=keys).signing(keys.parent).key
        assert key is not None
        self.key = key
        self.attacker = attacker
        self.me = procs.fleet.agent("spec_a").id
        self.master = procs.fleet.agent("coord").id
        self.sent: list[str] = []

    def send(self, kind: str, details: dict[str, Any], reply_to: str) -> None:
        payload = raw_envelope(kind, self.me, self.master, details, reply_to=reply_to)
        self.sent.append(json.loads(payload)["message_id"])
        topic = topics.inbox(self.master, self.me)
        signature = sign(topic, payload, self.key)
        self.attacker.publish(topic, payload, user_properties=[("vox-sig", signature)])


def siblings_request(attacker: Attacker, procs: FleetProcesses) -> Captured | None:
    """The command_request coord sent spec_b, as the broker-powered identity saw it."""
    topic = topics.inbox(procs.fleet.agent("spec_b").id, procs.fleet.agent("coord").id)
    for seen in attacker.captured():
        if seen.topic == topic and json.loads(seen.payload)["type"] == "command_request":
            return seen
    return None


async def show(capture: Any, procs: FleetProcesses, request_id: UUID) -> dict[str, Any]:
    code, out, err = await capture(
        "request", "show", str(request_id), "--json", "--config", procs.operator_config
    )
    assert (code, err) == (0, ""), err
    report: dict[str, Any] = json.loads(out)
    return report


def states(report: dict[str, Any]) -> list[str]:
    found: list[str] = []
    part: Any = report
    while isinstance(part, dict):
        found.append(part["state"])
        part = part.get("below")
    return found


def refused_at_coord(procs: FleetProcesses) -> list[dict[str, Any]]:
    return [
        r
        for r in ledger(procs, "coord")
        if r["action"] == "rejected" and str(r["reason"]).startswith("WRONG_ANSWERER")
    ]


def counted_at_coord(attacker: Attacker, procs: FleetProcesses) -> int:
    """Return rejected{reason="WRONG_ANSWERER"} of coord's last heartbeat (docs/metrics.md)."""
    status = topics.status(procs.fleet.agent("coord").id)
    last = [c for c in attacker.captured() if c.topic == status and c.payload]
    if not last:
        return 0
    figures = json.loads(last[-1].payload)["details"].get("metrics", {}).get("agent") or {}
    return int(figures.get("counters", {}).get("rejected", {}).get("WRONG_ANSWERER", 0))


async def scenario(procs: FleetProcesses, attacker: Attacker, capture: Any) -> None:
    await route_up(procs, "steps")
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "steps", f"count={STEPS}", "pause=1",
        "--detach", "--json", "--timeout", "120",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    request_id = UUID(json.loads(out)["request_id"])
    captured = await until(lambda: siblings_request(attacker, procs), "coord's request to spec_b")
    down = json.loads(captured.payload)["message_id"]

    # The leaf acknowledges its sibling's request, reports on it, then answers it.
    leaf = Leaf(procs, attacker)
    leaf.send("message_acknowledged", {"in_response_to": down}, down)
    leaf.send("command_progress", {"state": "working", "seq": 1, "fraction": 1.0}, down)
    leaf.send("command_result", {"result": FORGED}, down)
    refused = await until(
        lambda: len(refused_at_coord(procs)) >= 3 and refused_at_coord(procs), "3 refusals"
    )
    assert {r["message_id"] for r in refused} == set(leaf.sent)
    assert all(r["source"] == str(leaf.me) for r in refused)
    assert f"which it was not sent to (it went to {procs.fleet.agent('spec_b').id})" in str(
        refused[0]["reason"]
    )
    await until(lambda: counted_at_coord(attacker, procs) >= 3, "the refusals in coord's metrics")

    # The sibling still works, and every view says so; nothing forged went up.
    report = await show(capture, procs, request_id)
    assert states(report) == ["delegated", "delegated", "working"], report
    assert not any(FORGED in str(r.get("details")) for r in ledger(procs, "root"))

    # The operator, back, gets the sibling's answer; the request shows completed then.
    answers: list[VOXMessage] = []
    console = OperatorConsole(procs.operator_config)
    console.agent.listeners.append(
        lambda m: answers.append(m) if m.reply_to == request_id and m.type in ANSWERS else None
    )
    async with console:
        await until(lambda: answers, "the result at the operator", timeout=90)
    assert [a.type for a in answers] == ["command_result"], answers
    assert all(a.details["result"] == STEPS for a in answers), answers
    assert states(await show(capture, procs, request_id))[0] == "completed"
