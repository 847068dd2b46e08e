"""The same fence over TLS, where the client certificate (CN = UUID) is the identity."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.brokerkit import (
    NOT_AUTHORIZED,
    Client,
    SecureBroker,
    Witness,
    seven_agent_fleet,
    start_secure_broker,
    try_connect,
)
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.broker.passwd import load_credentials
from vox_mqtt.broker.pki import PkiLayout, init_pki
from vox_mqtt.cli import main
from vox_mqtt.fleet.bundles import render_agent_config

ALLOWED = {0x00, 0x10}


@pytest.fixture(scope="module", params=["acl", "dynsec"])
def tls_broker(
    request: pytest.FixtureRequest,
    module_broker_factory: Callable[..., LocalBroker],
    tmp_path_factory: pytest.TempPathFactory,
) -> SecureBroker:
    fleet = seven_agent_fleet()
    pki = tmp_path_factory.mktemp("pki")
    init_pki(pki, fleet, explorer=True)
    out = tmp_path_factory.mktemp(f"tls-{request.param}")
    return start_secure_broker(module_broker_factory, fleet, out, fmt=request.param, pki_dir=pki)


def test_every_identity_logs_in_with_its_certificate(tls_broker: SecureBroker) -> None:
    names = [tls_broker.fleet.operator_name, "explorer", *(a.name for a in tls_broker.fleet)]
    for name in names:
        creds = tls_broker.tls_creds(name)
        assert creds.tls
        assert creds.port == tls_broker.dir.tls_port
        assert try_connect(creds, tls=True) == 0, name


def test_tls_matrix_subset(tls_broker: SecureBroker) -> None:
    f = tls_broker.fleet
    spec, sibling, coord, root = f.agent("spec_a1"), f.agent("spec_a2"), f.agent("coord_a"), f.root
    witness = Witness(tls_broker.tls_creds("explorer"), "vox/#", tls=True)
    clients = {n: Client(tls_broker.tls_creds(n), tls=True) for n in ("spec_a1", "coord_a", "root")}
    try:
        for client in clients.values():
            assert client.connect() == 0
        reader = clients["spec_a1"]
        assert reader.subscribe([f"vox/{spec.id}/inbox/+"])[0] == 0x01
        witness.sync(clients["root"], f"vox/{root.id}/status")
        attempts = {
            ("spec_a1", f"vox/{coord.id}/inbox/{spec.id}"): True,
            ("spec_a1", f"vox/{spec.id}/status"): True,
            ("spec_a1", f"vox/warroom/{spec.id}/{spec.id}"): True,
            ("spec_a1", f"vox/{root.id}/inbox/{spec.id}"): False,
            ("spec_a1", f"vox/{coord.id}/inbox/{sibling.id}"): False,
            ("spec_a1", f"vox/{sibling.id}/status"): False,
            ("coord_a", f"vox/{spec.id}/inbox/{coord.id}"): True,
            ("coord_a", f"vox/{sibling.id}/inbox/{coord.id}"): True,
            ("root", f"vox/{spec.id}/inbox/{root.id}"): False,
        }
        for (name, topic), allowed in attempts.items():
            code = clients[name].publish(topic, f"T|{name}".encode())
            assert code == NOT_AUTHORIZED if not allowed else code in ALLOWED, topic
        witness.sync(clients["root"], f"vox/{root.id}/status")
        seen = {ln.split(" ")[0] for ln in witness.lines if " T|" in ln}
        assert seen == {topic for (_, topic), allowed in attempts.items() if allowed}
        clients["coord_a"].publish(f"vox/{spec.id}/inbox/{coord.id}", b"last")
        assert reader.wait_payload(b"last")
        got = {m.topic for m in reader.messages if m.payload.startswith(b"T|")}
        assert got == {f"vox/{spec.id}/inbox/{coord.id}"}  # not the sibling's inbox
    finally:
        witness.close()
        for client in clients.values():
            client.close()


def test_no_client_certificate_is_refused(tls_broker: SecureBroker) -> None:
    creds = dataclasses.replace(tls_broker.tls_creds("spec_a1"), cert_file=None, key_file=None)
    # The password is valid, but the TLS listener wants a certificate first.
    assert try_connect(creds, tls=True) != 0


def test_a_certificate_from_another_ca_is_refused(tls_broker: SecureBroker, tmp_path: Path) -> None:
    rogue = PkiLayout(tmp_path / "rogue")
    init_pki(rogue.root, tls_broker.fleet)
    spec = tls_broker.fleet.agent("spec_a1")
    creds = dataclasses.replace(
        tls_broker.tls_creds("spec_a1"),
        cert_file=rogue.client_cert(spec.id),
        key_file=rogue.client_key(spec.id),
    )
    assert try_connect(creds, tls=True) != 0


def test_the_certificate_not_the_username_decides_who_you_are(tls_broker: SecureBroker) -> None:
    f = tls_broker.fleet
    spec, coord, root = f.agent("spec_a1"), f.agent("coord_a"), f.root
    root_login = tls_broker.tls_creds("root")
    spec_cert = tls_broker.tls_creds("spec_a1")
    # spec_a1's certificate with root's username and password: still spec_a1.
    claimed = dataclasses.replace(
        spec_cert, username=root_login.username, password=root_login.password
    )
    client = Client(claimed, tls=True)
    try:
        assert client.connect() == 0
        assert client.publish(f"vox/{f.operator_id}/inbox/{root.id}", b"x") == NOT_AUTHORIZED
        assert client.publish(f"vox/{coord.id}/inbox/{spec.id}", b"x") in ALLOWED
    finally:
        client.close()


def test_with_tls_the_plain_listener_is_loopback_only(tls_broker: SecureBroker) -> None:
    conf = tls_broker.dir.conf.read_text()
    assert f"listener {tls_broker.dir.port} 127.0.0.1\n" in conf
    assert "require_certificate true" in conf
    assert "use_identity_as_username true" in conf


def test_the_operators_looks_log_in_with_their_own_certificates(
    tls_broker: SecureBroker, tmp_path: Path
) -> None:
    """`vox status` over TLS: the operator's bundle carries the look's certificate and key."""
    rendered = render_agent_config(
        tls_broker.fleet, "operator", tls_broker.dir.root, tmp_path / "etc" / "op.toml"
    )
    bundle = load_credentials(tmp_path / "etc" / "operator.credentials.toml")
    look = bundle.look("status")
    assert look is not None
    assert look.cert_file == Path("operator.tls/status.crt")
    assert (tmp_path / "etc" / "operator.tls" / "status.key").stat().st_mode & 0o777 == 0o600
    assert main(["status", "--config", str(rendered.config), "--json", "--wait", "0.5"]) == 0
    assert f"as {look.username} " in tls_broker.broker.log_text()
