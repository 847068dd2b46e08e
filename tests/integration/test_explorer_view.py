"""What an MQTT explorer sees: user properties that name the message type, sender and
target, and the payload-format indicator, witnessed by `mosquitto_sub -F` on a real broker."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, agent_config, operator_config, start_agents, wait_for
from tests.kits.brokerkit import SecureBroker, Witness, tree_fleet
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.broker.local import free_port
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import BrokerUnavailable, CommandFailed
from vox_mqtt.transport.session import BrokerSettings, Session

SEED = {"root": None, "coordinator": "root", "spec_a": "coordinator"}
# `mosquitto_sub -F`: topic, retained, payload format, content type, user props, payload
FORMAT = "%t\t%r\t%F\t%C\t%P\t%p"


def seen_on(explorer: Witness, topic: str) -> list[dict[str, Any]]:
    """Return what was seen on one topic: retained flag, format, content type, props."""
    seen = []
    for line in list(explorer.lines):
        where, retained, fmt, content, props, payload = line.split("\t", 5)
        if where != topic:
            continue
        pairs = dict(p.split(":", 1) for p in props.split() if ":" in p)
        seen.append(
            {"retained": retained, "format": fmt, "content": content, "payload": payload} | pairs
        )
    return seen


@pytest.fixture
def secure(secure_broker_factory: Any) -> SecureBroker:
    broker: SecureBroker = secure_broker_factory(tree_fleet(SEED))
    return broker


async def test_every_vox_publish_names_its_type_sender_and_target(
    secure: SecureBroker, tmp_path: Path
) -> None:
    fleet = secure.fleet
    ids = {a.name: a.id for a in fleet} | {"operator": fleet.operator_id}
    explorer = Witness(secure.creds("explorer"), "vox/#", fmt=FORMAT)
    try:
        await asyncio.sleep(0.5)  # its SUBACK
        async with AsyncExitStack() as stack:
            agents = await start_agents(stack, secure, tmp_path, {"spec_a": [Analyst()]})
            await wait_for(lambda: "analyze" in agents["root"].advertised_commands())
            console = await stack.enter_async_context(
                VOXAgent(operator_config(secure, tmp_path, observe=()))
            )
            reply = await console.request("analyze", {"target": "x"}, to=ids["root"])
            assert reply.details["result"]["by"] == "spec_a"
            with pytest.raises(CommandFailed) as failed:
                await console.request("nonesuch", {}, to=ids["root"])
            # A crash: the will and the master's war-room post carry properties too.
            assert agents["spec_a"].session is not None
            await agents["spec_a"].session.disconnect_abruptly()
            await wait_for(lambda: bool(agents["root"].incidents), timeout=15)
            await asyncio.sleep(0.5)
        assert failed.value.code == "NO_ROUTE"
        # What the root serves, so a typo is one look away from its fix.
        assert "it serves: analyze" in failed.value.error
    finally:
        explorer.close()

    def props(sender: str, target: str) -> list[dict[str, Any]]:
        return seen_on(explorer, topics.inbox(ids[target], ids[sender]))

    # Answers are never acknowledged (docs/messages.md): down the tree go requests only, and
    # the acknowledgements of requests come up.
    down = props("operator", "root")
    assert {p["vox-type"] for p in down} == {"command_request"}
    for seen in down:
        assert (seen["vox-from"], seen["vox-to"]) == ("operator", "root")
        assert (seen["format"], seen["content"]) == ("1", "application/json")
    hop = props("coordinator", "spec_a")
    assert {p["vox-type"] for p in hop} == {"command_request"}
    assert {(p["vox-from"], p["vox-to"]) for p in hop} == {("coordinator", "spec_a")}
    up = props("root", "operator")
    assert {p["vox-type"] for p in up} >= {
        "command_result",
        "command_error",
        "message_acknowledged",
    }
    assert {(p["vox-from"], p["vox-to"]) for p in up} == {("root", "operator")}
    # A status (and a presence) names its sender only: its master's name is not for every
    # reader of it.
    statuses = seen_on(explorer, topics.status(ids["spec_a"]))
    presences = seen_on(explorer, topics.presence(ids["spec_a"]))
    assert statuses
    assert presences
    for seen in statuses + presences:
        assert (seen["vox-type"], seen["vox-from"], seen["format"]) == (
            "agent_status",
            "spec_a",
            "1",
        )
        assert "vox-to" not in seen
    assert "VM_CONNECTION_LOST" in presences[-1]["payload"]  # the will, as the broker sent it
    posts = seen_on(explorer, topics.warroom(ids["coordinator"], ids["spec_a"]))
    assert posts
    assert (posts[0]["vox-type"], posts[0]["vox-from"], posts[0]["format"]) == (
        "system_failure",
        "coordinator",
        "1",
    )
    # No name crosses to a reader who could not know it: the root's hop to the coordinator
    # never carries a specialist's name.
    root_hop = props("root", "coordinator") + props("coordinator", "root")
    assert root_hop
    assert all("spec_a" not in (p["vox-from"], p["vox-to"]) for p in root_hop)


async def test_an_unreachable_broker_is_a_warning_once_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = BrokerSettings(
        port=free_port(), client_id="look", connect_timeout=2.5, reconnect_max=0.5
    )
    with (
        caplog.at_level(logging.DEBUG, logger="vox_mqtt.transport"),
        pytest.raises(BrokerUnavailable),
    ):
        async with Session(settings, subscriptions=()):
            pass
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 2, retries
    assert [r.levelno for r in retries][:2] == [logging.WARNING, logging.DEBUG]
    assert "connection refused" in retries[0].getMessage()


async def test_an_incident_is_a_warning_and_its_resolution_is_info(
    secure: SecureBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vox_mqtt.liveness")
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {})
        coordinator = agents["coordinator"]
        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        await wait_for(lambda: bool(agents["root"].incidents), timeout=15)
        # The same agent back (its epoch moves on, as its state dir says), on a new process.
        (tmp_path / "again" / "spec_a").mkdir(parents=True)
        (tmp_path / "again" / "spec_a" / "epoch").write_text("1\n")
        again = await stack.enter_async_context(
            VOXAgent(agent_config(secure, "spec_a", tmp_path / "again"))
        )
        assert again.epoch == 2
        await wait_for(lambda: not agents["root"].incidents, timeout=15)
        assert coordinator.incidents == []
    posts = [r for r in caplog.records if "war room:" in r.getMessage()]
    assert [(r.levelno, "resolved:" in r.getMessage()) for r in posts] == [
        (logging.WARNING, False),
        (logging.INFO, True),
    ]
