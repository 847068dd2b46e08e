"""A small fleet PKI: one CA, the broker's server certificate, one client certificate per identity.

Client certificates carry the identity's UUID as CN; the broker's TLS listener
uses that CN as the MQTT username, so a key file is the identity. Keys are ECDSA
P-256 (fast to make for 10,000 agents, supported by Mosquitto's OpenSSL) and are
written 0600. Re-running keeps what exists and issues only what is missing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from uuid import UUID

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vox_mqtt.broker.acl import fleet_identities
from vox_mqtt.broker.federation import bridges
from vox_mqtt.broker.passwd import atomic_write
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet

__all__ = ["DEFAULT_DAYS", "PkiLayout", "PkiReport", "init_pki"]

DEFAULT_DAYS: Final = 825  # leaf certificates; the CA gets ten years
_CA_DAYS: Final = 3650
_LOCAL_NAMES: Final = ("localhost", "127.0.0.1", "::1")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


@dataclass(frozen=True)
class PkiLayout:
    """Where each file of a PKI directory lives."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        """Return the CA certificate (give it to every client and the broker)."""
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """Return the CA private key (keep it on the operator's machine only)."""
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        """Return the broker's certificate."""
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        """Return the broker's private key."""
        return self.root / "server.key"

    def client_cert(self, identity: UUID) -> Path:
        """Return one identity's certificate."""
        return self.root / "clients" / f"{identity}.crt"

    def client_key(self, identity: UUID) -> Path:
        """Return one identity's private key."""
        return self.root / "clients" / f"{identity}.key"

    def missing(self, identities: Iterable[UUID]) -> list[Path]:
        """Return the files a TLS broker and these identities need but that do not exist."""
        needed = [self.ca_cert, self.server_cert, self.server_key]
        for identity in identities:
            needed += [self.client_cert(identity), self.client_key(identity)]
        return [path for path in needed if not path.is_file()]


@dataclass(frozen=True, kw_only=True)
class PkiReport:
    """What init_pki did."""

    layout: PkiLayout
    created: tuple[Path, ...]
    kept: int


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError([f"{path}: not an EC private key made by `vox pki init`"])
    return key


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vox-mqtt fleet"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


@dataclass(frozen=True)
class _Issuer:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _sign(
    builder: x509.CertificateBuilder, issuer: _Issuer | None, key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    signer = key if issuer is None else issuer.key
    public = key.public_key()
    builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
    if issuer is not None:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key())
        builder = builder.add_extension(aki, False)
    return builder.sign(signer, hashes.SHA256())


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Edge hosts' clocks drift: accept a certificate from a few minutes back.
        .not_valid_before(now - dt.timedelta(minutes=10))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _make_ca(layout: PkiLayout) -> _Issuer:
    key = _new_key()
    name = _name("vox-mqtt fleet CA")
    builder = (
        _builder(name, name, key, _CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    cert = _sign(builder, None, key)
    atomic_write(layout.ca_key, _key_pem(key), mode=0o600)
    atomic_write(layout.ca_cert, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return _Issuer(cert, key)


def _leaf(
    issuer: _Issuer, common_name: str, usage: x509.ObjectIdentifier, days: int, hosts: Sequence[str]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    builder = (
        _builder(_name(common_name), issuer.cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return _sign(builder, issuer, key), key


def _server_is_current(layout: PkiLayout, issuer: _Issuer, hosts: Sequence[str]) -> bool:
    if not (layout.server_cert.is_file() and layout.server_key.is_file()):
        return False
    cert = x509.load_pem_x509_certificate(layout.server_cert.read_bytes())
    if cert.issuer != issuer.cert.subject:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    present = {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    present |= set(san.get_values_for_type(x509.DNSName))
    wanted = {str(ipaddress.ip_address(h)) if _is_ip(h) else h for h in hosts}
    return wanted <= present


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _check_hosts(hosts: Iterable[str]) -> list[str]:
    return [
        f"--host {host!r} is neither an IP address nor a DNS name"
        for host in hosts
        if not _is_ip(host) and not _DNS_NAME.match(host)
    ]


def init_pki(
    directory: str | Path,
    fleet: Fleet,
    *,
    hosts: Sequence[str] = (),
    explorer: bool = False,
    explorers: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
) -> PkiReport:
    """Create or complete a PKI dir: CA, server cert for localhost + hosts, a cert per identity.

    explorer certifies the unnamed explorer, explorers each named one (acl.explorer_names).
    """
    problems = _check_hosts(hosts)
    if days < 1:
        problems.append(f"--days must be at least 1 (got {days})")
    if problems:
        raise ConfigError(problems)
    layout = PkiLayout(Path(directory))
    try:
        (layout.root / "clients").mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError([f"cannot create {layout.root}: {exc.strerror}"]) from None
    created: list[Path] = []
    kept = 0
    if layout.ca_cert.is_file() and layout.ca_key.is_file():
        ca_cert = x509.load_pem_x509_certificate(layout.ca_cert.read_bytes())
        issuer = _Issuer(ca_cert, _load_key(layout.ca_key))
        kept += 1
    elif layout.ca_cert.exists() or layout.ca_key.exists():
        raise ConfigError([f"{layout.root}: ca.crt and ca.key must both exist or both be absent"])
    else:
        issuer = _make_ca(layout)
        created += [layout.ca_cert, layout.ca_key]

    # One server certificate serves every broker of a federated fleet.
    all_hosts = list(dict.fromkeys([*_LOCAL_NAMES, *hosts, *(b.host for b in fleet.brokers)]))
    if _server_is_current(layout, issuer, all_hosts):
        kept += 1
    else:
        cert, key = _leaf(
            issuer, "vox-mqtt broker", ExtendedKeyUsageOID.SERVER_AUTH, days, all_hosts
        )
        atomic_write(layout.server_key, _key_pem(key), mode=0o600)
        atomic_write(layout.server_cert, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        created += [layout.server_cert, layout.server_key]

    bridge_ids = [bridge.identity() for bridge in bridges(fleet)]
    every = fleet_identities(fleet, explorer=explorer, explorers=explorers)
    for identity in (*every, *bridge_ids):
        cert_path, key_path = layout.client_cert(identity.id), layout.client_key(identity.id)
        if cert_path.is_file() and key_path.is_file():
            kept += 1
            continue
        cert, key = _leaf(issuer, identity.username, ExtendedKeyUsageOID.CLIENT_AUTH, days, ())
        atomic_write(key_path, _key_pem(key), mode=0o600)
        atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        created += [cert_path, key_path]
    return PkiReport(layout=layout, created=tuple(created), kept=kept)
