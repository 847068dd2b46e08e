"""Client ids are locked to usernames by default: no identity takes over another's session."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.kits.brokerkit import Client, SecureBroker, seven_agent_fleet
from vox_mqtt.broker.passwd import load_credentials
from vox_mqtt.fleet.bundles import render_agent_config

SecureFactory = Callable[..., SecureBroker]
ALLOWED = {0x00, 0x10}


def test_a_takeover_is_refused_and_the_session_and_queue_survive(
    secure_broker_factory: SecureFactory,
) -> None:
    """F5: spec_a1's secret with coord_a's client id kicked coord_a and wiped its queue."""
    secure = secure_broker_factory(seven_agent_fleet())
    f = secure.fleet
    coord, root = f.agent("coord_a"), f.root
    inbox = f"vox/{coord.id}/inbox/{root.id}"
    victim = Client(secure.creds("coord_a"), session_expiry=3600)
    assert victim.connect() == 0
    assert victim.subscribe([f"vox/{coord.id}/inbox/+"]) == [0x01]

    # While it runs: the intruder's claim to its client id kicks nobody.
    intruder = Client(secure.creds("spec_a1"), client_id=str(coord.id))
    try:
        assert intruder.connect() == 0
        time.sleep(0.3)
        assert victim.connected
    finally:
        intruder.close()
    victim.close()

    # While it is away: three messages wait in its session; the intruder cannot take them.
    sender = Client(secure.creds("root"))
    try:
        assert sender.connect() == 0
        payloads = [f"queued-{n}".encode() for n in range(3)]
        assert set(sender.publish_many([(inbox, p) for p in payloads])) <= ALLOWED
    finally:
        sender.close()
    thief = Client(secure.creds("spec_a1"), client_id=str(coord.id), session_expiry=3600)
    try:
        assert thief.connect() == 0
        assert not thief.session_present
        time.sleep(0.3)
        assert thief.messages == []
    finally:
        thief.close()

    back = Client(secure.creds("coord_a"), session_expiry=3600)
    try:
        assert back.connect() == 0
        assert back.session_present
        assert back.wait_for(lambda ms: len(ms) >= 3)
        assert sorted(m.payload for m in back.messages) == payloads
    finally:
        back.close()
    log = secure.broker.log_text()
    assert f"Client {coord.id} already connected" not in log


def test_the_credentials_say_what_the_broker_enforces(
    secure_broker_factory: SecureFactory,
) -> None:
    locked = secure_broker_factory(seven_agent_fleet())
    unlocked = secure_broker_factory(seven_agent_fleet(), lock_client_ids=False)
    for secure, enforced in ((locked, True), (unlocked, False)):
        assert secure.dir.credentials_for("coord_a").client_id_locked is enforced
        # The agent's bundle says it in words too.
        out = secure.dir.root.parent / f"bundle-{enforced}" / "coord_a.toml"
        rendered = render_agent_config(secure.fleet, "coord_a", secure.dir.root, out)
        path = rendered.secrets[0]
        text = path.read_text()
        assert load_credentials(path).client_id_locked is enforced
        conf = secure.dir.conf.read_text()
        assert ("use_username_as_clientid true" in conf) is enforced
        if enforced:
            assert "the broker enforces it (use_username_as_clientid)" in text
        else:
            assert "this broker does NOT enforce it" in text
    # The operator's file carries its looks: one read-only identity per kind of look.
    operator = locked.dir.credentials_for(locked.fleet.operator_name)
    assert [look.purpose for look in operator.looks] == ["exporter", "status", "watch"]
    assert len({look.username for look in operator.looks} | {operator.username}) == 4
