"""Federated fleets for real: a core and two sites, each its own Mosquitto, and real daemons."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.brokerkit import NOT_AUTHORIZED, Client, Witness
from tests.kits.federationkit import Federation, federated_fleet_text, running_federation
from tests.kits.fleetproc import wait_for_route, wait_until
from vox_mqtt.broker.federation import bridge_id, broker_identities, link_topic
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics

pytestmark = pytest.mark.slow

ANALYST = ("tests.kits.agentkit:Analyst",)
# core <- east <- west: the specialist on west is two bridges from the operator.
BROKERS: dict[str, str | None] = {"core": None, "east": "core", "west": "east"}
AGENTS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "root": (None, None, ()),
    "coord": ("root", "east", ()),
    "spec_w": ("coord", "west", ANALYST),
    "spec_e": ("coord", None, ()),  # on east, its master's broker
}


def _witness_sees(witness: Witness, line: str, timeout: float = 15.0) -> bool:
    return witness.wait_line(line, timeout)


def _cli_pub(creds: Credentials, topic: str) -> int:
    """Publish "forged" with mosquitto_pub (exit 0 even when refused: the witness judges)."""
    args = f"-h {creds.host} -p {creds.port} -V 5 -q 1 -t {topic} -m forged".split()
    args += ["-u", creds.username, "-P", creds.password, "-i", f"{creds.username}-pub"]
    done = subprocess.run(
        ["mosquitto_pub", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return done.returncode


async def _command(federation: Federation) -> Any:
    async with OperatorConsole(
        federation.operator_config, observe=[topics.STATUS_FILTER]
    ) as console:
        await wait_for_route(console, "analyze", timeout=60)
        return await console.send_command("analyze", {"target": "plant.pdf"}, wait=30)


@pytest.mark.parametrize(("fmt", "tls"), [("acl", False), ("dynsec", False), ("acl", True)])
def test_a_command_crosses_two_bridges_and_its_result_comes_back(
    tmp_path: Path, fmt: str, tls: bool
) -> None:
    text = federated_fleet_text(AGENTS, BROKERS)
    with running_federation(tmp_path, text, fmt=fmt, tls=tls) as federation:
        if tls:
            # Every client and both bridges log in with certificates on the TLS listeners.
            bridge_conf = (federation.dirs["west"].root / "bridge" / "bridge.conf").read_text()
            assert f"address 127.0.0.1:{federation.dirs['east'].tls_port}" in bridge_conf
            assert "bridge_certfile" in bridge_conf
            assert "remote_password" not in bridge_conf
            spec_conf = federation.configs["spec_w"].read_text()
            assert f"port = {federation.dirs['west'].tls_port}" in spec_conf
        federation.start()
        reply = asyncio.run(_command(federation))
        assert reply.details["result"]["target"] == "plant.pdf"
        assert reply.details["result"]["by"] == "spec_w"
        # The specialist's only connection is to its own site broker.
        spec_log = federation.daemons["spec_w"].log()
        assert "Traceback" not in spec_log
        assert federation.brokers["west"].log_text().count(str(federation.id("spec_w"))) >= 1


def test_the_firewall_holds_across_bridges(tmp_path: Path) -> None:
    """A site's clients and its bridge identity try every forbidden direction."""
    text = federated_fleet_text(
        {
            "root": (None, None, ()),
            "coord_e": ("root", "east", ()),
            "spec_e": ("coord_e", None, ()),
            "coord_w": ("root", "west", ()),
            "spec_w": ("coord_w", None, ()),
            "coord_c": ("root", None, ()),
            "spec_c": ("coord_c", None, ()),
        },
        {"core": None, "east": "core", "west": "core"},
    )
    for fmt in ("acl", "dynsec"):
        # Unlocked client ids: the probes log in with the identities' secrets beside their
        # real sessions (the bridge's among them) without taking those over.
        with running_federation(tmp_path / fmt, text, fmt=fmt, lock_client_ids=False) as fed:
            _check_firewall(fed, fmt)
            _check_write_matrix(fed)


def _universe(fed: Federation) -> list[str]:
    """Return every VOX topic of the fleet: each inbox pair, status, war-room pair and link."""
    everyone = [*(a.id for a in fed.fleet), fed.fleet.operator_id]
    found = [topics.inbox(a, b) for a in everyone for b in everyone if a != b]
    found += [topics.status(a) for a in everyone]
    found += [topics.warroom(a, b) for a in everyone for b in everyone]
    found += [link_topic(bridge_id(fed.fleet, site)) for site in ("east", "west")]
    return found


def _check_write_matrix(fed: Federation) -> None:
    """Every topic of the fleet, written by a site's bridge identity and by a site's agent.

    What the broker's ACL refuses must match the rendered rules exactly (PUBACK 0x87
    for a topic outside them), and an independent `mosquitto_sub` on the core (the
    explorer) must see none of the refused ones.
    """
    universe = _universe(fed)
    witness = Witness(fed.creds("core", "explorer"), "vox/#")
    try:
        assert witness.wait_first(10)  # the retained link states: subscribed
        cases = [("core", "bridge-east"), ("east", "spec_e"), ("west", "coord_w")]
        allowed_any: set[str] = set()
        for broker, name in cases:
            identity = next(i for i in broker_identities(fed.fleet, broker) if i.name == name)
            client = _probe(fed.creds(broker, name))
            try:
                codes = client.publish_many([(t, b"matrix") for t in universe])
            finally:
                client.close()
            for topic, code in zip(universe, codes, strict=True):
                allowed = identity.may_write(topic)
                assert (code != NOT_AUTHORIZED) == allowed, (name, topic, hex(code))
                if allowed:
                    allowed_any.add(topic)
            assert sum(identity.may_write(t) for t in universe) < len(universe) / 4, name
        # No refused write reached the core (some allowed ones did, across the bridges).
        root = _probe(fed.creds("core", "root"))
        try:
            witness.sync(root, topics.status(fed.id("root")))
        finally:
            root.close()
        arrived = {ln.split(" ", 1)[0] for ln in witness.lines if ln.endswith(" matrix")}
        assert arrived
        assert arrived <= allowed_any, sorted(arrived - allowed_any)
    finally:
        witness.close()


def _probe(creds: Credentials) -> Client:
    """Log in with an identity's secret under another client id (no session takeover)."""
    client = Client(creds, client_id=f"{creds.username}-probe")
    assert client.connect() == 0
    return client


def _check_firewall(fed: Federation, fmt: str) -> None:
    ids = {agent.name: agent.id for agent in fed.fleet}
    east_bridge = fed.creds("core", "bridge-east")
    attacker = _probe(east_bridge)
    # Speaking for anyone not on its site: the core's agents, the other site's, the root.
    forged = [
        topics.status(ids["root"]),
        topics.status(ids["coord_c"]),
        topics.status(ids["spec_w"]),
        topics.inbox(ids["root"], ids["coord_w"]),
        topics.inbox(ids["coord_c"], ids["spec_c"]),
        topics.inbox(ids["spec_c"], ids["coord_c"]),
        topics.inbox(ids["coord_w"], ids["root"]),
        topics.inbox(ids["coord_e"], ids["root"]),  # the root's words, not the site's
        topics.warroom(ids["coord_w"], ids["spec_w"]),
        topics.warroom(ids["root"], ids["root"]),
        link_topic(bridge_id(fed.fleet, "west")),
    ]
    codes = attacker.publish_many([(t, b"forged") for t in forged])
    assert codes == [NOT_AUTHORIZED] * len(forged), list(zip(forged, codes, strict=True))
    # What it legitimately carries is allowed.
    carried = [topics.status(ids["spec_e"]), topics.inbox(ids["root"], ids["coord_e"])]
    assert all(code in (0x00, 0x10) for code in attacker.publish_many(
        [(t, b"carried") for t in carried]))  # fmt: skip
    # Reading: only what goes down to its site. dynsec refuses the SUBSCRIBE; acl_file
    # grants it and filters delivery, checked below in both formats.
    forbidden_reads = [
        topics.inbox_filter(ids["coord_w"]),
        topics.inbox_filter(ids["spec_c"]),
        topics.status(ids["coord_w"]),
        topics.WARROOM_FILTER,
        "vox/#",
    ]
    codes = attacker.subscribe([topics.inbox(ids["coord_e"], ids["root"]), *forbidden_reads])
    want = [NOT_AUTHORIZED if fmt == "dynsec" else 1] * len(forbidden_reads)
    assert codes == [1, *want]
    watcher = Witness(fed.creds("core", "explorer"), "vox/#")
    spec_e = _probe(fed.creds("east", "spec_e"))
    try:
        assert watcher.wait_first(10)  # the retained link states: the witness is subscribed
        # mosquitto_pub with the bridge's secret, an independent client: refused the same way.
        for topic in forged[:4]:
            _cli_pub(east_bridge, topic)
        # A site agent on its own broker cannot reach the other site or the core's agents.
        reach = [
            topics.inbox(ids["root"], ids["spec_e"]),
            topics.inbox(ids["spec_w"], ids["spec_e"]),
            topics.inbox(ids["coord_w"], ids["spec_e"]),
            topics.status(ids["coord_e"]),
        ]
        assert spec_e.publish_many([(t, b"forged") for t in reach]) == [NOT_AUTHORIZED] * 4
        spec_e.subscribe([topics.inbox_filter(ids["coord_e"]), topics.status(ids["spec_w"])])
        # Legitimate traffic the attacker and spec_e must not see.
        root = _probe(fed.creds("core", "root"))
        coord_c = _probe(fed.creds("core", "coord_c"))
        coord_w = _probe(fed.creds("west", "coord_w"))
        try:
            assert root.publish(topics.inbox(ids["coord_w"], ids["root"]), b"secret-1") == 0
            assert coord_c.publish(topics.inbox(ids["spec_c"], ids["coord_c"]), b"secret-2") in (
                0x00,
                0x10,
            )
            assert coord_w.publish(topics.status(ids["coord_w"]), b"secret-3") in (0, 0x10)
            assert root.publish(topics.inbox(ids["coord_e"], ids["root"]), b"for-east") in (
                0x00,
                0x10,
            )
        finally:
            for client in (root, coord_c, coord_w):
                client.close()
        # The explorer on the core sees every secret (coord_w's status crossed its bridge)...
        for payload in ("secret-1", "secret-2", "secret-3"):
            assert (
                wait_until(
                    lambda p=payload: any(line.endswith(f" {p}") for line in watcher.lines), 15
                )
                >= 0
            )
        # ...the bridge's identity receives only what is meant for its site,
        assert attacker.wait_payload(b"for-east", 10)
        got = {m.payload for m in attacker.messages}
        assert not got & {b"secret-1", b"secret-2", b"secret-3"}, got
        assert not {m.payload for m in spec_e.messages} & {b"secret-1", b"secret-3"}
        # ...and nothing forged reached the core.
        assert not any(line.endswith(" forged") for line in watcher.lines), watcher.lines
    finally:
        watcher.close()
        spec_e.close()
        attacker.close()


def test_a_link_state_is_retained_on_the_core(tmp_path: Path) -> None:
    text = federated_fleet_text(AGENTS, BROKERS)
    with running_federation(tmp_path, text) as fed:
        op = fed.creds("core", "operator")
        watcher = Witness(op, "vox/link/+")
        try:
            for site in ("east", "west"):
                line = f"{link_topic(bridge_id(fed.fleet, site))} 1"
                assert _witness_sees(watcher, line), watcher.lines
        finally:
            watcher.close()
        assert UUID(op.username) == fed.fleet.operator_id
