"""A reload proves the fleet's whole policy, not the canary's line (acl and dynsec).

On a real Mosquitto secured from a seven-agent fleet: hand edits accepted with
`--accept-edit` that would take every agent's rights away, or open the broker
(`defaultACLAccess`, `allow_anonymous`), are refused before anything reaches the broker,
with one line and exit 2; an independent client of each kind sees the rules unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.kits.brokerkit import NOT_AUTHORIZED, Client, SecureBroker, seven_agent_fleet
from vox_mqtt.broker.probe import alive
from vox_mqtt.cli import main
from vox_mqtt.protocol import topics

ALLOWED = {0x00, 0x10}
SecureFactory = Callable[..., SecureBroker]


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _still_fenced(secure: SecureBroker) -> None:
    """The agents still publish where the fleet lets them, and not elsewhere."""
    spec = secure.fleet.agent("spec_a1")
    client = Client(secure.creds("spec_a1"))
    client.connect()
    try:
        assert client.publish(topics.status(spec.id), b"") in ALLOWED
        assert client.publish(topics.status(secure.fleet.root.id), b"x") == NOT_AUTHORIZED
    finally:
        client.close()


def _reload(secure: SecureBroker, *extra: str) -> int:
    pid = ["--pid", str(secure.broker.pid)] if secure.dir.fmt == "acl" else []
    return main(["broker", "reload", str(secure.dir.root), *pid, *extra])


def test_an_acl_cut_down_to_the_canary_is_refused(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    acl = secure.dir.root / "acl"
    kept, keep = [], False
    for line in acl.read_text().splitlines():
        if line.startswith("# "):
            keep = "canary" in line
        if keep:
            kept.append(line)
    acl.write_text("\n".join(kept) + "\n")
    assert _reload(secure, "--accept-edit") == 2
    line = _one_error(capsys)
    assert "refusing to reload" in line
    assert "probed paths would change" in line
    assert alive(secure.broker.pid)
    _still_fenced(secure)


def test_allow_anonymous_is_refused_before_the_signal(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    conf = secure.dir.conf
    conf.write_text(conf.read_text().replace("allow_anonymous false", "allow_anonymous true"))
    assert _reload(secure) == 2
    assert "allow_anonymous is not false" in _one_error(capsys)
    _still_fenced(secure)


def test_dynsec_without_the_agents_roles_or_with_an_open_default_is_refused(
    secure_broker_factory: SecureFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = secure_broker_factory(seven_agent_fleet(), fmt="dynsec")
    path = secure.dir.root / "dynsec.json"
    rendered = path.read_text()
    document = json.loads(rendered)
    agents = {str(agent.id) for agent in secure.fleet}
    for client in document["clients"]:
        if client["username"] in agents:
            client["roles"] = []
    path.write_text(json.dumps(document))
    assert _reload(secure, "--accept-edit") == 2
    line = _one_error(capsys)
    assert "refusing to apply" in line
    assert "must be allowed" in line
    _still_fenced(secure)

    document = json.loads(rendered)
    document["defaultACLAccess"] = {k: True for k in document["defaultACLAccess"]}
    path.write_text(json.dumps(document))
    assert _reload(secure, "--accept-edit") == 2
    assert "defaultACLAccess must set publishClientSend" in _one_error(capsys)
    _still_fenced(secure)
    # The rendered file again: applied and proven as before.
    path.write_text(rendered)
    assert _reload(secure) == 0, capsys.readouterr().err
    _still_fenced(secure)
