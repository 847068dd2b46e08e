"""A dynamic-security broker takes a changed fleet live, on its control topic: no signal."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable

import pytest

from tests.kits.brokerkit import (
    NOT_AUTHORIZED,
    Client,
    SecureBroker,
    add_agent,
    seven_agent_fleet,
    try_connect,
)
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli import main
from vox_mqtt.protocol.hierarchy import Fleet

SecureFactory = Callable[..., SecureBroker]
ALLOWED = {0x00, 0x10}


def rerender(secure: SecureBroker, fleet: Fleet, *rotate: str) -> None:
    secure.fleet = fleet
    secure.dir = render_broker_dir(
        fleet,
        secure.dir.root,
        port=secure.dir.port,
        fmt="dynsec",
        explorer=True,
        run_as_user=getpass.getuser(),
        rotate_names=rotate,
    )


def apply(secure: SecureBroker, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["broker", "reload", str(secure.dir.root)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "applied live through the dynamic-security plugin" in out
    return out


def logins(secure: SecureBroker, username: str) -> int:
    return secure.broker.log_text().count(f"as {username} ")


def test_a_changed_fleet_is_applied_live_and_unaffected_sessions_stay(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    f = secure.fleet
    bystanders = {n: Client(secure.creds(n)) for n in ("root", "spec_b1", "coord_b")}
    coord = Client(secure.creds("coord_a"))
    try:
        for client in (*bystanders.values(), coord):
            assert client.connect() == 0
        before = {n: logins(secure, c.creds.username) for n, c in bystanders.items()}

        # An unchanged render sends nothing at all.
        rerender(secure, f)
        assert "(nothing; no signal)" in apply(secure, capsys)

        grown = add_agent(f, "spec_a3", "coord_a")
        newcomer = grown.agent("spec_a3")
        topic = f"vox/{newcomer.id}/inbox/{grown.agent('coord_a').id}"
        assert coord.publish(topic, b"too early") == NOT_AUTHORIZED
        rerender(secure, grown)
        out = apply(secure, capsys)
        assert "1 createClient" in out
        assert "1 createRole" in out
        assert "forbidden publish -> 0x87" in out

        # The plugin disconnects the clients whose rules changed (and only those); a
        # daemon reconnects at once and resumes its persistent session.
        kicked = [
            line.split("Client ", 1)[1].split(" ", 1)[0]
            for line in secure.broker.log_text().splitlines()
            if "disconnected by administrative action" in line
        ]
        changed = {coord.creds.username, secure.dir.credentials_for("_canary").username}
        assert coord.creds.username in kicked
        assert set(kicked) <= changed
        arrival = Client(secure.creds("spec_a3"))
        sender = Client(secure.creds("coord_a"))
        try:
            assert arrival.connect() == 0
            assert arrival.subscribe([f"vox/{newcomer.id}/inbox/+"]) == [0x01]
            assert sender.connect() == 0
            assert sender.publish(topic, b"welcome") in ALLOWED
            assert arrival.wait_payload(b"welcome")
        finally:
            arrival.close()
            sender.close()
        # Nobody else was touched: same connections, no signal, no restart.
        for name, client in bystanders.items():
            assert client.connected, name
            assert logins(secure, client.creds.username) == before[name], name
        assert "Reloading config" not in secure.broker.log_text()
    finally:
        for client in (*bystanders.values(), coord):
            client.close()


def test_one_identity_is_rekeyed_live_and_the_old_secret_is_refused(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    old: Credentials = secure.creds("spec_b1")
    root = Client(secure.creds("root"))
    try:
        assert root.connect() == 0
        rerender(secure, secure.fleet, "spec_b1")
        out = apply(secure, capsys)
        assert "1 setClientPassword" in out
        assert try_connect(old) >= 0x80  # type: ignore[operator]
        assert try_connect(secure.creds("spec_b1")) == 0
        assert root.connected
        assert logins(secure, root.creds.username) == 1
    finally:
        root.close()


def test_only_the_broker_directory_holds_the_admin(
    secure_broker_factory: SecureFactory,
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    agent = Client(secure.creds("root"))
    try:
        assert agent.connect() == 0
        command = b'{"commands":[{"command":"deleteClient","username":"x"}]}'
        assert agent.publish("$CONTROL/dynamic-security/v1", command) == NOT_AUTHORIZED
    finally:
        agent.close()
    admin = secure.dir.credentials_for("_admin")
    assert admin.host == "127.0.0.1"
    assert not admin.tls


def test_an_apply_the_canary_cannot_prove_is_rolled_back(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand edit that takes the canary's right away: the previous rules come back."""
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    rerender(secure, secure.fleet)
    apply(secure, capsys)  # proven: last-good/ now holds these rules
    grown = add_agent(secure.fleet, "spec_a3", "coord_a")
    rerender(secure, grown)
    path = secure.dir.root / "dynsec.json"
    document = json.loads(path.read_text())
    for role in document["roles"]:
        role["acls"] = [a for a in role["acls"] if not a["topic"].startswith("vox/canary/")]
    path.write_text(json.dumps(document))
    args = ["broker", "reload", str(secure.dir.root), "--verify-timeout", "1"]
    assert main(args) == 2  # a hand edit needs --accept-edit
    capsys.readouterr()
    # The fleet's probed policy refuses it before anything is sent (docs/broker.md)...
    assert main([*args, "--accept-edit"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "refusing to apply" in line
    assert "_canary" in line
    assert try_connect(secure.creds("spec_a3")) >= 0x80  # type: ignore[operator]
    # ...and without policy.json (an older render) the canary catches it after the apply.
    (secure.dir.root / "policy.json").unlink()
    assert main([*args, "--accept-edit"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("vox: error: APPLY FAILED: allowed publish -> 0x87")
    assert "re-applied the previous rules" in line
    # Back to the previous rules: the newcomer is unknown again, the canary proves the rest.
    assert try_connect(secure.creds("spec_a3")) >= 0x80  # type: ignore[operator]
    assert try_connect(secure.creds("spec_a1")) == 0
