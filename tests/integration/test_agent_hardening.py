"""The agent's side of broker hardening: retained inboxes, forged war-room posts, private state."""

from __future__ import annotations

import asyncio
import os
import stat
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Tally, start_agents, wait_for
from tests.kits.brokerkit import Client, SecureBroker, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.cli import main
from vox_mqtt.observe.warroomguard import WARROOM_MAX_BYTES
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, CommandRequest, new_message, serialize
from vox_mqtt.protocol.topics import WARROOM_ID

SEED = {"root": None, "coordinator": "root", "spec_a": "coordinator", "spec_b": "coordinator"}
ALLOWED = {0x00, 0x10}


@pytest.fixture
def secure(secure_broker_factory: Any) -> SecureBroker:
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED))
    return broker


async def until_recorded(agent: VOXAgent, message_id: Any, action: str) -> list[dict[str, Any]]:
    """Wait until the agent's ledger holds a row with this action for the message."""
    for _ in range(200):
        found = await agent.memory.find(message_id)
        if any(r["action"] == action for r in found):
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {action} row: {found}")


async def test_a_retained_inbox_message_is_rejected_and_never_runs(
    secure: SecureBroker, tmp_path: Path
) -> None:
    """F11: a retained command was re-delivered on every reconnect."""
    f = secure.fleet
    spec, coord = f.agent("spec_a"), f.agent("coordinator")
    request = new_message(
        MSG_COMMAND_REQUEST,
        source=coord.id,
        target=spec.id,
        details=CommandRequest(command="tally", params={"n": 1}),
    )
    sender = Client(secure.creds("coordinator"))
    try:
        assert sender.connect() == 0
        topic = f"vox/{spec.id}/inbox/{coord.id}"
        assert sender.publish(topic, serialize(request), retain=True) in ALLOWED
    finally:
        sender.close()
    tally = tmp_path / "tally"
    for _ in range(2):  # and again after a restart: the broker re-delivers it each time
        async with AsyncExitStack() as stack:
            roles = {"spec_a": [Tally(settings={"tally_file": str(tally)})]}
            agents = await start_agents(stack, secure, tmp_path, roles, ["spec_a"])
            found = await until_recorded(agents["spec_a"], request.message_id, "rejected")
            assert "retained" in (found[-1]["reason"] or "")
            assert not any(r["action"] == "received" for r in found)
    assert not tally.exists()


async def test_the_root_drops_forged_and_oversized_war_room_posts(
    secure: SecureBroker, tmp_path: Path
) -> None:
    """The broker is the first check; the receiver checks again (here the ACL is widened)."""
    f = secure.fleet
    spec, root = f.agent("spec_a"), f.root
    coord = f.agent("coordinator")
    assert secure.dir.acl is not None
    own = f"topic write vox/warroom/{spec.id}/{spec.id}"
    widened = tmp_path / "acl.widened"
    widened.write_text(
        secure.dir.acl.read_text().replace(own, f"topic write vox/warroom/{spec.id}/+")
    )
    pid = str(secure.broker.pid)
    args = ["broker", "reload", str(secure.dir.root), "--pid", pid, "--acl", str(widened)]
    assert main([*args, "--accept-edit"]) == 0

    def post(subject: Any, description: str) -> bytes:
        return serialize(
            new_message(
                MSG_SYSTEM_FAILURE,
                source=spec.id,
                target=WARROOM_ID,
                details=SystemFailure(
                    error_code="FORGED", severity="CRITICAL", description=description
                ),
            )
        )

    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, ["root", "coordinator"])
        await wait_for(lambda: coord.id in {a.id for a in agents["root"].fleet_view.agents()})
        forger = Client(secure.creds("spec_a"))
        try:
            assert forger.connect() == 0
            assert forger.publish(f"vox/warroom/{spec.id}/{root.id}", post(root.id, "x")) in ALLOWED
            big = "y" * (WARROOM_MAX_BYTES + 1)
            assert forger.publish(f"vox/warroom/{spec.id}/{spec.id}", post(spec.id, big)) in ALLOWED
            honest = post(spec.id, "disk almost full")
            assert forger.publish(f"vox/warroom/{spec.id}/{spec.id}", honest) in ALLOWED
        finally:
            forger.close()
        await wait_for(lambda: len(agents["root"].incidents) >= 1)
        subjects = {(i.topic.source, i.topic.subject) for i in agents["root"].incidents}
        assert subjects == {(spec.id, spec.id)}
        [incident] = agents["root"].incidents
        assert incident.failure.description == "disk almost full"


async def test_state_dirs_and_ledgers_are_private(secure: SecureBroker, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        async with AsyncExitStack() as stack:
            await start_agents(stack, secure, tmp_path / "state", {}, ["spec_b"])
    finally:
        os.umask(old)
    state = tmp_path / "state" / "spec_b"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    # The ledger and its WAL files; anything else sits behind the 0700 directory.
    ledger = [p for p in state.iterdir() if p.name.startswith("logs.db")]
    assert ledger
    for path in ledger:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
