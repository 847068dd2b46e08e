"""F25: a flooding leaf does not make an offline operator lose the result of its request.

The freelance roles on daemons: root (Root) -> coord (Coordinator) -> mail, spec (the
lifecycle kit's `steps`). The operator sends `steps` with `vox send --detach` and goes
away. The leaf `mail`, compromised, sends its coordinator 1,100 job notifications (the
broker-powered identity of tests/kits/attackerkit.py publishes them on mail's own topic,
which also counts what reaches the operator's inbox). Coord takes them at its child_rate
and child_backlog, refuses the rest (counted, one war-room incident), the root holds
back copies to its silent operator, and the answer is never given up: the operator, back
after the root's request_timeout, gets the genuine result.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.attackerkit import Attacker, add_attacker, raw_envelope
from tests.kits.clikit import capture
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.freelancekit import next_monday
from tests.kits.lifecyclekit import route_up, until
from vox_mqtt.agent.plan import ANSWERS
from vox_mqtt.broker.render import queue_limits
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import VOXMessage

__all__ = ["capture"]  # the fixture this module borrows

pytestmark = pytest.mark.slow

SHAPE: dict[str, str | None] = {"root": None, "coord": "root", "mail": "coord", "spec": "coord"}
FLOOD = 1_100
STEPS = 3
# The root's request_timeout, shortened from every level's default of 30 s: the root used
# to give the answer up at it, and the operator comes back after it.
REQUEST_TIMEOUT = 10.0
AFTER = 2.0  # s: the operator is back this long past it


def fleet(tmp: Path) -> str:
    roles = {
        "root": ["examples.freelance:Root"],
        "coord": ["examples.freelance:Coordinator"],
        "spec": ["tests.kits.lifecyclekit:Lifecycle"],
    }
    settings = {"spec": {"events_file": str(tmp / "events.txt")}}
    return fleet_text(SHAPE, roles=roles, settings=settings)


def test_the_answer_survives_a_flood_while_the_operator_is_away(
    tmp_path: Path, capture: Any
) -> None:
    with run_fleet(tmp_path, fleet(tmp_path), before_broker=add_attacker, start=False) as procs:
        root = procs.agents["root"].config
        text = root.read_text()
        assert "request_timeout = 30.0" in text, text
        root.write_text(
            text.replace("request_timeout = 30.0", f"request_timeout = {REQUEST_TIMEOUT}")
        )
        procs.start_all()
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(scenario(procs, attacker, capture))
        finally:
            attacker.close()


def job(n: int) -> dict[str, Any]:
    start, end = next_monday(9), next_monday(17)
    return {
        "start_time": start.isoformat(),
        "end_time": end.isoformat(),
        "estimated_effort_minutes": 1 + n % 50,
        "price": {"currency": "USD", "value": 30},
        "note_to_human": f"flood {n}",
    }


def heartbeat_figure(attacker: Attacker, agent: UUID, label: str) -> int:
    """Return rejected{reason=label} of an agent's last heartbeat (docs/metrics.md)."""
    last = [c for c in attacker.captured() if c.topic == topics.status(agent) and c.payload]
    if not last:
        return 0
    figures = json.loads(last[-1].payload)["details"].get("metrics", {}).get("agent") or {}
    return int(figures.get("counters", {}).get("rejected", {}).get(label, 0))


async def scenario(procs: FleetProcesses, attacker: Attacker, capture: Any) -> None:
    ids = {spec.name: spec.id for spec in procs.fleet}
    operator = procs.fleet.operator_id
    await route_up(procs, "steps")
    code, out, err = await capture(
        "send", "--config", procs.operator_config, "steps", f"count={STEPS}", "pause=1",
        "--detach", "--json", "--timeout", "300",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    request_id = UUID(json.loads(out)["request_id"])

    # The operator is away; the leaf floods its coordinator.
    flood_topic = topics.inbox(ids["coord"], ids["mail"])
    for n in range(FLOOD):
        payload = raw_envelope("job_detected", ids["mail"], ids["coord"], job(n))
        attacker.publish(flood_topic, payload)
    to_operator = topics.inbox(operator, ids["root"])

    def answer_sent() -> bool:
        return any(
            c.topic == to_operator and json.loads(c.payload)["type"] == "command_result"
            for c in attacker.captured()
        )

    # Once the flood is sent and the root's answer seen (the root sent it before), the
    # operator stays away past the root's request_timeout on the answer and on the copies
    # of the flood: when the root used to give the answer up, and when re-sent copies (at
    # 1 s, 3 s, 7 s) would have filled the operator's queue.
    await until(answer_sent, "the root's answer to the operator", timeout=120)
    await asyncio.sleep(REQUEST_TIMEOUT + AFTER)

    reaching = [c for c in attacker.captured() if c.topic == to_operator]
    kinds = [json.loads(c.payload)["type"] for c in reaching]
    limit, _ = queue_limits(len(SHAPE) + 1)
    print(
        f"F25 figures: {len(reaching)} publishes to the offline operator"
        f" ({kinds.count('job_detected')} job_detected, {kinds.count('command_result')}"
        f" command_result), queue limit {limit}"
    )
    assert len(reaching) < limit, len(reaching)  # the operator's queue never filled
    assert kinds.count("command_result") >= 1
    # The flood was refused at its first master, counted, and posted once.
    await until(lambda: heartbeat_figure(attacker, ids["coord"], "FLOODING") > 0, "FLOODING")
    incident = topics.warroom(ids["coord"], ids["mail"])
    posts = [c for c in attacker.captured() if c.topic == incident and c.payload]
    assert posts, "no incident about the flooding leaf"
    assert b"CHILD_MISBEHAVING" in posts[0].payload
    assert b"child_" in posts[0].payload  # names the limit (child_rate or child_backlog)

    # Back: the operator gets the genuine result.
    answers: list[VOXMessage] = []
    console = OperatorConsole(procs.operator_config)
    console.agent.listeners.append(
        lambda m: answers.append(m) if m.reply_to == request_id and m.type in ANSWERS else None
    )
    async with console:
        await until(lambda: answers, "the result at the operator", timeout=60)
    assert answers[0].type == "command_result", answers
    assert answers[0].details["result"] == STEPS, answers
