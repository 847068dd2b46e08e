"""Signatures where a fleet changes: `accept` while it upgrades, retirement, bridged sites.

Each runs real daemons on real Mosquitto brokers (docs/security.md, modes): in `accept` the
unsigned is taken and counted, the signed verified and the forged refused; `vox fleet
retire` says RETIRED with the retired agent's own key, which its master believes; a signed
message crosses two bridges with its `vox-sig` and verifies at the far end.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from uuid import UUID

import pytest

from tests.kits.attackerkit import (
    Attacker,
    add_attacker,
    ledger,
    raw_envelope,
    rows_of,
    target_fleet,
    wait_rejected,
)
from tests.kits.federationkit import federated_fleet_text, running_federation
from tests.kits.fleetproc import FleetProcesses, run_fleet, wait_for_route, wait_until
from vox_mqtt.cli import main
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.config import SigningSection
from vox_mqtt.ledger.signatures import check_signatures
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.topics import STATUS_FILTER

pytestmark = pytest.mark.slow


def keyring_of(config: Path) -> SigningSection:
    name = config.stem
    return SigningSection(keys_file=config.parent / f"{name}.signing.toml")


def report(procs: FleetProcesses, name: str) -> tuple[int, int, int]:
    """Return (verified, unsigned, refused) over an agent's ledger, as `vox ledger verify`."""
    keyring = keyring_of(procs.agents[name].config).signing(Path.cwd()).keyring
    seen = check_signatures(ledger(procs, name), keyring)
    return seen.verified, seen.unsigned, len(seen.problems)


async def answer(config: Path, target: str) -> str:
    async with OperatorConsole(config) as console:
        await wait_for_route(console, "analyze")
        reply = await console.send_command("analyze", {"target": target}, wait=30)
        return str(reply.details["result"]["target"])


def test_accept_takes_and_counts_the_unsigned_verifies_the_signed_refuses_the_forged(
    tmp_path: Path,
) -> None:
    text = target_fleet("accept")
    with run_fleet(tmp_path, text, before_broker=add_attacker) as procs:
        ids = {spec.name: spec.id for spec in procs.fleet}
        assert asyncio.run(answer(procs.operator_config, "signed.pdf")) == "signed.pdf"
        # spec_a subscribed (its inbox gets what follows), whoever served the first command.
        wait_until(lambda: "serving spec_a" in procs.agents["spec_a"].log(), 20, "spec_a up")
        attacker = Attacker(procs.broker_dir.port)
        try:
            topic = topics.inbox(ids["spec_a"], ids["coord"])
            command = {"command": "analyze", "params": {"target": "unsigned.pdf"}}
            unsigned = raw_envelope("command_request", ids["coord"], ids["spec_a"], command)
            forged = raw_envelope("command_request", ids["coord"], ids["spec_a"], command)
            kid = "0" * 16
            attacker.publish(topic, unsigned)  # an agent not yet upgraded, as accept allows
            attacker.publish(topic, forged, user_properties=[("vox-sig", f"{kid}.{'A' * 86}")])
        finally:
            attacker.close()
        unsigned_id = json.loads(unsigned)["message_id"]
        forged_id = json.loads(forged)["message_id"]
        # The unsigned command is taken and run; the badly signed one is refused.
        wait_until(
            lambda: any(
                r["message_id"] == unsigned_id and r["action"] == "completed"
                for r in ledger(procs, "spec_a")
            ),
            20,
            "the unsigned command served",
        )
        reasons = wait_rejected(procs, "spec_a", 1)
        assert len(reasons) == 1, reasons
        assert reasons[0].startswith("UNKNOWN_KEY"), reasons
        assert not [
            r
            for r in ledger(procs, "spec_a")
            if r["message_id"] == forged_id and r["action"] != "rejected"
        ]
        # The ledger counts what came unsigned; everything signed verifies.
        _, count, refused = report(procs, "spec_a")
        assert (count, refused) == (1, 0)
        # spec_a may hold nothing signed (the first command went to either specialist); the
        # root and the coordinator took that command, signed, on its way down.
        for name in ("root", "coord"):
            verified, count, refused = report(procs, name)
            assert verified > 0, name
            assert (count, refused) == (0, 0), name
        keys = procs.agents["spec_a"].config.parent / "spec_a.signing.toml"
        assert main(["ledger", str(procs.ledger("spec_a")), "verify", "--keys", str(keys)]) == 0
        # ... and so does the agent, in its heartbeat's metrics (vox_agent_unsigned_total).
        assert asyncio.run(unsigned_counted(procs, ids["spec_a"])) == 1


async def unsigned_counted(procs: FleetProcesses, agent: UUID) -> int:
    """Return the unsigned count of an agent's heartbeat, once it says any."""
    async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
        async with asyncio.timeout(20):
            while True:
                entry = console.view.get(agent)
                figures = (entry.metrics or {}).get("agent") if entry is not None else None
                if isinstance(figures, dict) and figures["counters"]["unsigned"]:
                    return int(figures["counters"]["unsigned"])
                await asyncio.sleep(0.1)


def test_retire_says_retired_with_the_agents_own_key_and_its_master_believes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = target_fleet("require")
    with run_fleet(tmp_path, text) as procs:
        ids = {spec.name: spec.id for spec in procs.fleet}
        assert asyncio.run(answer(procs.operator_config, "before.pdf")) == "before.pdf"
        procs.agents["spec_b"].stop()
        blocks = text.split("\n\n")
        kept = [b for b in blocks if 'name = "spec_b"' not in b]
        assert len(kept) == len(blocks) - 1
        new_fleet = tmp_path / "without-spec_b.toml"
        new_fleet.write_text("\n\n".join(kept))
        capsys.readouterr()
        code = main(
            [
                "fleet",
                "retire",
                "spec_b",
                "--fleet",
                str(new_fleet),
                "--broker-dir",
                str(procs.broker_dir.root),
            ]
        )
        out = capsys.readouterr().out
        assert code == 0, out
        coord = procs.agents["coord"]
        # Its master took the RETIRED status (signed with spec_b's key) and forgot it.
        wait_until(lambda: "retired: forgets spec_b" in coord.log(), 20, "the master to forget")
        assert "refused a message" not in coord.log(), coord.log()
        assert str(ids["spec_b"]) not in asyncio.run(statuses(procs))
        assert asyncio.run(answer(procs.operator_config, "after.pdf")) == "after.pdf"


async def statuses(procs: FleetProcesses) -> str:
    """Return the ids the operator's look sees, once the retained statuses came."""
    async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
        await asyncio.sleep(2)
        return " ".join(str(entry.id) for entry in console.view.agents() if entry.seen)


BROKERS: dict[str, str | None] = {"core": None, "east": "core", "west": "east"}
AGENTS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "root": (None, None, ()),
    "coord": ("root", "east", ()),
    "spec_w": ("coord", "west", ("tests.kits.agentkit:Analyst",)),
}


def test_a_signed_message_crosses_two_bridges_and_verifies(tmp_path: Path) -> None:
    text = 'signatures = "require"\n' + federated_fleet_text(AGENTS, BROKERS)
    with running_federation(tmp_path, text) as federation:
        federation.start()
        assert asyncio.run(answer(federation.operator_config, "plant.pdf")) == "plant.pdf"
        # Each hop's ledger holds the signatures that crossed the bridges, and they verify.
        for name in ("root", "coord", "spec_w"):
            config = federation.configs[name]
            keyring = keyring_of(config).signing(Path.cwd()).keyring
            rows = asyncio.run(rows_of(federation.root / "state" / name / "logs.db"))
            seen = check_signatures(rows, keyring)
            assert (seen.unsigned, seen.problems) == (0, ()), name
            assert seen.verified > 0, name
        for name, daemon in federation.daemons.items():
            assert "refused a message" not in daemon.log(), (name, daemon.log())
