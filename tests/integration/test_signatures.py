"""Signed envelopes against an identity with the broker's power, on a live fleet of daemons.

The attacker may read and write every topic (docs/security.md, threat model). Everything it
forges or replays is refused and recorded with its reason; no handler runs for it; no view
shows a forged state; the real traffic is answered as before.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from tests.kits.attackerkit import (
    Attacker,
    add_attacker,
    command_capture,
    ledger,
    raw_envelope,
    wait_rejected,
    wait_view,
)
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet, wait_for_route, wait_until
from tests.kits.freelancekit import NOTE, drop, job_mail
from vox_mqtt.broker.signkeys import load_keys
from vox_mqtt.cli import main
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.fleet.config import SigningSection
from vox_mqtt.ledger.signatures import check_signatures
from vox_mqtt.observe.status import ACTIVE, INACTIVE
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import now_iso
from vox_mqtt.protocol.signing import FORGED_TRAFFIC, SigningKey, sign
from vox_mqtt.protocol.topics import STATUS_FILTER, WARROOM_FILTER

pytestmark = pytest.mark.slow

SHAPE: dict[str, str | None] = {
    "root": None,
    "coord_a": "root",
    "coord_b": "root",
    "spec_a1": "coord_a",
    "spec_a2": "coord_a",
    "spec_b1": "coord_b",
    "spec_b2": "coord_b",
}
ANALYST = ["tests.kits.agentkit:Analyst"]


def signed_fleet() -> str:
    roles = {name: ANALYST for name in SHAPE if name.startswith("spec")}
    return 'signatures = "require"\n' + fleet_text(SHAPE, roles=roles)


def test_forgeries_and_replays_are_refused_and_real_traffic_goes_on(tmp_path: Path) -> None:
    with run_fleet(tmp_path, signed_fleet(), before_broker=add_attacker) as procs:
        ids = {spec.name: spec.id for spec in procs.fleet}
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(scenario(procs, attacker, ids))
        finally:
            attacker.close()
        # Each ledger proves who sent what it received (`vox ledger verify --keys`).
        for name in SHAPE:
            keys = procs.agents[name].config.parent / f"{name}.signing.toml"
            assert main(["ledger", str(procs.ledger(name)), "verify", "--keys", str(keys)]) == 0
            keyring = SigningSection(keys_file=keys).signing(Path.cwd()).keyring
            report = check_signatures(ledger(procs, name), keyring)
            assert report.unsigned == 0, name
            assert report.verified > 0 or name != "root", name  # some served nothing
        # No genuine message was refused: every forgery above is unsigned or badly signed, and
        # an unknown key would mean a peer's real traffic (e.g. a war-room post) was refused.
        assert "UNKNOWN_KEY" not in procs.logs()
        # No byte of what the attacker forged became a handler's work anywhere.
        for name in SHAPE:
            for row in ledger(procs, name):
                if row["action"] in ("started", "completed", "delegated"):
                    assert row["message_id"] not in FORGED_IDS, (name, row)


FORGED_IDS: set[str] = set()


async def scenario(procs: FleetProcesses, attacker: Attacker, ids: dict[str, UUID]) -> None:
    async with OperatorConsole(
        procs.operator_config, observe=[STATUS_FILTER, WARROOM_FILTER]
    ) as console:
        await wait_for_route(console, "analyze")
        for name in SHAPE:
            await wait_view(console, ids[name], ACTIVE, timeout=60)
        first = await console.send_command("analyze", {"target": "before.pdf"}, wait=20)
        assert first.details["result"]["target"] == "before.pdf"
        captured, spec, coord = command_capture(attacker, ids)
        sibling = next(n for n, m in SHAPE.items() if m == coord and n != spec)
        sig = dict(captured.user_properties)["vox-sig"]
        kid = sig.partition(".")[0]

        def forge(topic: str, payload: bytes, props: list[tuple[str, str]] | None = None) -> None:
            FORGED_IDS.add(json.loads(payload)["message_id"])
            attacker.publish(topic, payload, user_properties=props)

        # 1. A command to the specialist "from" its coordinator: unsigned, then a made-up signature.
        command = {"command": "analyze", "params": {"target": "forged.pdf"}}
        forge(
            topics.inbox(ids[spec], ids[coord]),
            raw_envelope("command_request", ids[coord], ids[spec], command),
        )
        forge(
            topics.inbox(ids[spec], ids[coord]),
            raw_envelope("command_request", ids[coord], ids[spec], command),
            [("vox-sig", f"{kid}.{'A' * 86}")],
        )
        # 2. A result to the root "from" a coordinator; 3. an acknowledgement to a coordinator.
        forge(
            topics.inbox(ids["root"], ids[coord]),
            raw_envelope(
                "command_result",
                ids[coord],
                ids["root"],
                {"result": {"forged": True}},
                reply_to=str(uuid4()),
            ),
        )
        forge(
            topics.inbox(ids[coord], ids[spec]),
            raw_envelope(
                "message_acknowledged",
                ids[spec],
                ids[coord],
                {"in_response_to": str(uuid4())},
                reply_to=str(uuid4()),
            ),
        )
        # 4. The captured command: replayed as it was, moved to the sibling's inbox, changed.
        attacker.publish(captured.topic, captured.payload, user_properties=captured.user_properties)
        moved = topics.inbox(ids[sibling], ids[coord])
        attacker.publish(moved, captured.payload, user_properties=captured.user_properties)
        changed = json.loads(captured.payload)
        changed["details"]["params"]["target"] = "changed.pdf"
        # (its id is the real command's: that one ran once, as it should)
        attacker.publish(
            captured.topic, json.dumps(changed).encode(), user_properties=captured.user_properties
        )

        spec_reasons = await asyncio.to_thread(wait_rejected, procs, spec, 3)
        assert sum(r.startswith("MISSING_SIGNATURE") for r in spec_reasons) == 1, spec_reasons
        assert sum(r.startswith("BAD_SIGNATURE") for r in spec_reasons) == 2, spec_reasons
        # One war-room incident about it from the specialist, however many forgeries came.
        own = topics.warroom(ids[spec], ids[spec])
        await wait_incident(console, own, "signature failed")
        posts = [
            c for c in attacker.captured() if c.topic == own and b"signature failed" in c.payload
        ]
        assert len(posts) == 1, posts
        assert (await asyncio.to_thread(wait_rejected, procs, sibling, 1))[0].startswith(
            "BAD_SIGNATURE"
        )
        assert (await asyncio.to_thread(wait_rejected, procs, "root", 1))[0].startswith(
            "MISSING_SIGNATURE"
        )
        assert (await asyncio.to_thread(wait_rejected, procs, coord, 1))[0].startswith(
            "MISSING_SIGNATURE"
        )
        # The exact replay is a duplicate: re-acknowledged, never run again.
        replay_id = json.loads(captured.payload)["message_id"]
        await asyncio.to_thread(
            wait_until,
            lambda: any(
                r["action"] == "duplicate" and r["message_id"] == replay_id
                for r in ledger(procs, spec)
            ),
            20,
            "the replay recorded as a duplicate",
        )
        started = [
            r
            for r in ledger(procs, spec)
            if r["action"] == "started" and r["message_id"] == replay_id
        ]
        assert len(started) == 1

        # 5. Statuses: ACTIVE for a stopped agent, INACTIVE for a live one; 6. a war-room post.
        stopped = next(n for n in SHAPE if n.startswith("spec") and n not in (spec, sibling))
        procs.agents[stopped].stop()
        await wait_view(console, ids[stopped], INACTIVE)
        status_of = {seen.topic: seen.payload for seen in attacker.captured() if seen.payload}
        for name, state in ((stopped, ACTIVE), (sibling, INACTIVE)):
            real = json.loads(status_of[topics.status(ids[name])])
            real.update(message_id=str(uuid4()), emitted_at=now_iso())
            real["details"].update(status=state, epoch=real["details"]["epoch"] + 1)
            attacker.publish(topics.status(ids[name]), json.dumps(real).encode(), retain=True)
        incident = raw_envelope(
            "system_failure",
            ids[coord],
            topics.WARROOM_ID,
            {"error_code": "FORGED", "severity": "CRITICAL", "description": "forged"},
        )
        attacker.publish(topics.warroom(ids[coord], ids[coord]), incident, retain=True)
        # A real round trip after them: every forgery before it has been judged by now.
        after = await console.send_command("analyze", {"target": "after.pdf"}, wait=20)
        assert after.details["result"]["target"] == "after.pdf"
        # The console refused the two statuses and the post (counted by reason).
        await wait_rejections(console, 3)
        assert console.view.get(ids[stopped]).status == INACTIVE  # type: ignore[union-attr]
        assert console.view.get(ids[sibling]).status == ACTIVE  # type: ignore[union-attr]
        assert not any(i.failure.error_code == "FORGED" for i in console.agent.incidents)


async def wait_rejections(console: OperatorConsole, count: int) -> None:
    async with asyncio.timeout(20):
        while True:
            if sum(console.agent.metrics.rejected.values.values()) >= count:
                return
            await asyncio.sleep(0.05)


ROTATE_SHAPE: dict[str, str | None] = {
    "root": None,
    "coordinator": "root",
    "specialist_a": "coordinator",
    "specialist_b": "coordinator",
}


def rotation_fleet() -> str:
    """The signed fleet a rotation is tried on: two analysts under the coordinator."""
    roles = {"specialist_a": ANALYST, "specialist_b": ANALYST}
    return 'signatures = "require"\n' + fleet_text(ROTATE_SHAPE, roles=roles)


def rotated(procs: FleetProcesses, tmp_path: Path, name: str) -> SigningKey:
    """Rotate one agent's key and render its bundle, its master's and its children's again
    (docs/security.md, rotation, steps 1 and 2); return the key it retired."""
    ids = {spec.name: spec.id for spec in procs.fleet}
    old = load_keys(procs.broker_dir.root).current[ids[name]]
    fleet_file = str(tmp_path / "fleet.toml")
    assert (
        main(["pki", "keys", fleet_file, "--out", str(procs.broker_dir.root), "--rotate", name])
        == 0
    )
    assert load_keys(procs.broker_dir.root).current[ids[name]].kid != old.kid
    for each in ROTATE_SHAPE:
        agent = procs.agents[each]
        render_agent_config(
            procs.fleet, each, procs.broker_dir.root, agent.config, agent.state_dir, keepalive=5
        )
    return old


def reload(procs: FleetProcesses, name: str) -> None:
    """SIGHUP one daemon and wait until it took the new keys."""
    procs.agents[name].signal(signal.SIGHUP)
    wait_until(
        lambda: "new signing keys" in procs.agents[name].log(), 20, f"{name} to take the new keys"
    )


def attack_with(procs: FleetProcesses, old: SigningKey) -> list[str]:
    """Send specialist_a a command as the coordinator under its retired key; return the
    reasons specialist_a's ledger recorded for what it refused."""
    ids = {spec.name: spec.id for spec in procs.fleet}
    attacker = Attacker(procs.broker_dir.port)
    try:
        topic = topics.inbox(ids["specialist_a"], ids["coordinator"])
        command = {"command": "analyze", "params": {"target": "old-key.pdf"}}
        payload = raw_envelope("command_request", ids["coordinator"], ids["specialist_a"], command)
        attacker.publish(topic, payload, user_properties=[("vox-sig", sign(topic, payload, old))])
    finally:
        attacker.close()
    return wait_rejected(procs, "specialist_a", 1)


def serving_rotation_fleet(procs: FleetProcesses) -> None:
    """Wait for a first answer and every daemon serving: the rotation is of a running fleet."""
    asyncio.run(first_answer(procs, "before.pdf"))
    # The route needs one specialist: the other may still be starting, and the SIGHUP
    # must reach a daemon that serves.
    for name in ROTATE_SHAPE:
        wait_until(lambda name=name: f"serving {name}" in procs.agents[name].log(), 30, name)


def test_one_agent_rotates_its_key_on_a_running_fleet(tmp_path: Path) -> None:
    with run_fleet(tmp_path, rotation_fleet(), before_broker=add_attacker) as procs:
        serving_rotation_fleet(procs)
        old = rotated(procs, tmp_path, "coordinator")
        # SIGHUP, the rotated agent last (docs/security.md, rotation): its birth under the
        # new key then reaches peers that know that key, and ends their grace for its old one.
        for name in [*(n for n in ROTATE_SHAPE if n != "coordinator"), "coordinator"]:
            reload(procs, name)
        # The rotated agent's new connection is up; the new key verifies both ways.
        wait_until(
            lambda: procs.agents["coordinator"].log().count("connected to") == 2,
            20,
            "the rotated agent to connect again",
        )
        asyncio.run(first_answer(procs, "after.pdf"))
        # A routine rotation refused nothing: no agent saw forged traffic.
        for name, agent in procs.agents.items():
            assert "FORGED_TRAFFIC" not in agent.log(), (name, agent.log())
        # The retired key is refused by name at a child.
        reasons = attack_with(procs, old)
        assert reasons[0].startswith("RETIRED_KEY"), reasons
        # Nobody else reconnected: one connection per daemon. The rotated one reconnected
        # once, cleanly, to register its will signed with its new key.
        for name, agent in procs.agents.items():
            assert agent.log().count("connected to") == (2 if name == "coordinator" else 1), (
                name,
                agent.log(),
            )
        assert "reconnecting once for its will" in procs.agents["coordinator"].log()
        # Killed, its will verifies under the new key at its master: INACTIVE at once, not
        # refused (RETIRED_KEY) and left to go stale.
        root = procs.agents["root"]
        procs.agents["coordinator"].kill()
        wait_until(
            lambda: "coordinator ACTIVE -> INACTIVE" in root.log(), 10, "the will at the root"
        )
        assert "STALE" not in root.log().partition("coordinator ACTIVE -> INACTIVE")[0][-2000:]
        assert "RETIRED_KEY" not in root.log(), root.log()


def test_the_rotated_agent_reloaded_first_gets_no_grace_after_its_peers_reload(
    tmp_path: Path,
) -> None:
    # The order the docs warn against: the children refuse the rotated agent's birth (a key
    # they cannot know yet); once reloaded, that refused birth verifies under the new keys
    # and ends the old key's grace at once (protocol/signing.py, carry_over), whichever
    # child the next command goes to.
    with run_fleet(tmp_path, rotation_fleet(), before_broker=add_attacker) as procs:
        ids = {spec.name: spec.id for spec in procs.fleet}
        serving_rotation_fleet(procs)
        old = rotated(procs, tmp_path, "coordinator")
        reload(procs, "root")
        reload(procs, "coordinator")
        presence = topics.presence(ids["coordinator"])
        for name in ("specialist_a", "specialist_b"):
            wait_until(
                lambda name=name: (
                    f"refused a message on {presence}: UNKNOWN_KEY" in procs.agents[name].log()
                ),
                20,
                f"{name} to refuse the rotated agent's birth",
            )
        children = {ids["specialist_a"], ids["specialist_b"]}
        # Each child's refusal raised its FORGED_TRAFFIC incident...
        wait_forged_traffic(procs, children, open_now=True)
        for name in ("specialist_a", "specialist_b"):
            reload(procs, name)
            # Its log says what the refusal was, for the operator who saw the incident.
            assert "its rotation was reloaded before this agent" in procs.agents[name].log()
        # ... which its reload ends: the refusal behind it was the rotation (forgedtraffic.py).
        wait_forged_traffic(procs, children, open_now=False)
        asyncio.run(first_answer(procs, "after.pdf"))
        reasons = attack_with(procs, old)
        assert reasons[0].startswith("RETIRED_KEY"), reasons


def wait_forged_traffic(procs: FleetProcesses, agents: set[UUID], *, open_now: bool) -> None:
    """Wait until the war room holds a FORGED_TRAFFIC incident open for each of the agents
    (open_now) or for none of them, as `vox warroom --json` tells the operator."""

    config = str(procs.operator_config)
    command = [sys.executable, "-m", "vox_mqtt.cli", "warroom", "--json", "--config", config]

    def held() -> set[UUID]:
        listed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        # One cause: its code; several: each named in the incident's text.
        return {
            UUID(row["source"])
            for row in rows
            if not row["resolved"]
            and (row["error_code"] == FORGED_TRAFFIC or f"({FORGED_TRAFFIC})" in row["description"])
        }

    wait_until(
        lambda: (held() & agents == agents) if open_now else not held() & agents,
        30,
        f"FORGED_TRAFFIC {'open' if open_now else 'resolved'} at {sorted(map(str, agents))}",
    )


async def first_answer(procs: FleetProcesses, target: str) -> None:
    async with OperatorConsole(procs.operator_config) as console:
        await wait_for_route(console, "analyze")
        reply = await console.send_command("analyze", {"target": target}, wait=20)
        assert reply.details["result"]["target"] == target


def test_the_note_to_human_is_sealed_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    intake = tmp_path / "intake"
    roles = {
        "root": ["examples.freelance:Root"],
        "coordinator": ["examples.freelance:Coordinator"],
        "specialist_a": ["examples.freelance:MailWatcher"],
        "specialist_b": ANALYST,
    }
    settings = {"specialist_a": {"intake_dir": str(intake), "poll_interval": 0.05, "settle": 0.05}}
    text = 'signatures = "require"\n' + fleet_text(ROTATE_SHAPE, roles=roles, settings=settings)
    with run_fleet(tmp_path, text, before_broker=add_attacker) as procs:
        attacker = Attacker(procs.broker_dir.port)
        try:
            asyncio.run(first_answer(procs, "up.pdf"))
            intake.mkdir(exist_ok=True)
            drop(intake, "job-1.eml", job_mail())
            wait_until(
                lambda: any(
                    r["action"] == "received" and r["message_type"] == "job_detected"
                    for r in ledger(procs, "root")
                ),
                30,
                "the job at the root",
            )
            capsys.readouterr()
            code = main(["inbox", "--config", str(procs.operator_config), "--json", "--wait", "2"])
            assert code == 0
            [job] = [e for e in json.loads(capsys.readouterr().out) if e["type"] == "job_detected"]
            assert NOTE in job["details"]["note_to_human"]  # opened with the operator's key
            # Without the key it stays sealed, in the words of the web console's rows.
            [keys] = [
                path
                for path in procs.operator_config.parent.glob("*.signing.toml")
                if "seal_key = " in path.read_text()
            ]
            keys.write_text(re.sub(r"(?m)^seal_key = .*\n", "", keys.read_text()))
            code = main(["inbox", "--config", str(procs.operator_config), "--json", "--wait", "1"])
            assert code == 0
            [job] = [e for e in json.loads(capsys.readouterr().out) if e["type"] == "job_detected"]
            shown = job["details"]["note_to_human"]
            assert shown == "(sealed for the operator: this console has no operator key to open it)"
            captured = attacker.captured()
        finally:
            attacker.close()
    jobs = [c for c in captured if b'"job_detected"' in c.payload]
    assert jobs, "the attacker saw the job go by"
    for secret in (b"Client: Netwire", b"O-26-XXXXX"):
        # Not on the broker (every message, as the all-powerful identity saw them) ...
        assert not [c.topic for c in captured if secret in c.payload], secret
        # ... nor in any file of any state directory (ledgers, WALs, the operator's inbox).
        for path in sorted((tmp_path / "state").rglob("*")):
            if path.is_file():
                assert secret not in path.read_bytes(), path


async def wait_incident(console: OperatorConsole, topic: str, words: str) -> None:
    async with asyncio.timeout(20):
        while True:
            for incident in console.agent.incidents:
                if incident.topic.topic == topic and words in incident.failure.description:
                    return
            await asyncio.sleep(0.05)
