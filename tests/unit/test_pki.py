"""`vox pki init`: a CA, the broker's certificate and one client certificate per identity."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.kits.brokerkit import add_agent, seven_agent_fleet
from vox_mqtt.broker.acl import explorer_id
from vox_mqtt.broker.pki import PkiLayout, init_pki
from vox_mqtt.protocol.errors import ConfigError


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_makes_a_ca_a_server_and_a_certificate_per_identity(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    report = init_pki(tmp_path, fleet, hosts=["broker.example", "10.1.2.3"], explorer=True)
    layout = report.layout
    # operator, its three looks (watch, status, exporter), explorer and agents: a
    # certificate each.
    assert len(report.created) == 4 + 2 * (len(fleet) + 5)
    ca = _cert(layout.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = _cert(layout.server_cert)
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "broker.example"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("10.1.2.3"),
    }
    ids = [fleet.operator_id, explorer_id(fleet), *(a.id for a in fleet)]
    for identity in ids:
        cert = _cert(layout.client_cert(identity))
        cert.verify_directly_issued_by(ca)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        assert cn == str(identity)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert _mode(layout.client_key(identity)) == 0o600
    assert _mode(layout.ca_key) == 0o600
    assert _mode(layout.server_key) == 0o600


def test_rerunning_keeps_everything_and_adds_only_what_is_missing(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    first = init_pki(tmp_path, fleet)
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = init_pki(tmp_path, fleet)
    assert again.created == ()
    assert again.kept == 2 + len(fleet) + 4  # CA, server; agents, operator and its 3 looks
    bigger = add_agent(fleet, "spec_a3", "coord_a")
    grown = init_pki(tmp_path, bigger)
    newcomer = bigger.agent("spec_a3").id
    assert set(grown.created) == {
        first.layout.client_cert(newcomer),
        first.layout.client_key(newcomer),
    }
    assert all(p.read_bytes() == data for p, data in snapshot.items())


def test_a_new_host_reissues_only_the_server_certificate(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    layout = init_pki(tmp_path, fleet).layout
    ca = layout.ca_cert.read_bytes()
    report = init_pki(tmp_path, fleet, hosts=["edge-broker.lan"])
    assert set(report.created) == {layout.server_cert, layout.server_key}
    assert layout.ca_cert.read_bytes() == ca
    san = _cert(layout.server_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "edge-broker.lan" in san.value.get_values_for_type(x509.DNSName)


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    with pytest.raises(ConfigError, match="neither an IP address nor a DNS name"):
        init_pki(tmp_path, fleet, hosts=["bad host"])
    with pytest.raises(ConfigError, match="--days"):
        init_pki(tmp_path, fleet, days=0)
    layout = PkiLayout(tmp_path / "half")
    layout.root.mkdir()
    layout.ca_cert.write_text("orphan")
    with pytest.raises(ConfigError, match="both exist or both be absent"):
        init_pki(layout.root, fleet)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create"):
        init_pki(blocker / "pki", fleet)
