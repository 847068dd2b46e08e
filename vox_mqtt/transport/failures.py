"""Why a connection failed or ended, in words a person can act on (docs/transport.md)."""

from __future__ import annotations

import ssl

from vox_mqtt.protocol.errors import BrokerUnavailable, Refused
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.wire import ConnectionLost, ConnectRefused

__all__ = ["broker_error", "tls_context"]

# CONNACK reason codes that no retry will cure: the operator has to fix credentials or config.
_REFUSALS = {0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C}
_CREDENTIALS = {0x86, 0x87, 0x8C}


def broker_error(exc: BaseException, s: BrokerSettings) -> BrokerUnavailable:
    """Translate any low-level connection failure into a message a person can act on."""
    where = f"the broker at {s.address}"
    if isinstance(exc, BrokerUnavailable):
        return exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Refused(
            f"TLS: the certificate of {where} did not verify against {s.ca_file}: "
            f"{exc.verify_message} — check ca_file and that the certificate names {s.host}"
        )
    if isinstance(exc, ssl.SSLError):
        if "ALERT" in str(exc).upper():
            # The handshake went through on our side, then the broker ended the session:
            # TLS 1.3 says a refused client certificate this way.
            return Refused(
                f"TLS: {where} ended the session: {exc.reason or exc} — check cert_file and "
                "key_file (the broker may require a client certificate)"
            )
        return Refused(
            f"TLS handshake with {where} failed: {exc.reason or exc} — check the client "
            f"certificate and that {s.address} is a TLS listener"
        )
    if isinstance(exc, ConnectionRefusedError):
        return BrokerUnavailable(
            f"cannot reach {where}: connection refused — is mosquitto running and listening there?"
        )
    if isinstance(exc, TimeoutError):
        return BrokerUnavailable(f"no answer from {where} within {s.connect_timeout:g}s")
    if isinstance(exc, OSError):
        return BrokerUnavailable(f"cannot reach {where}: {exc.strerror or exc}")
    if isinstance(exc, ConnectRefused):
        if exc.code in _CREDENTIALS:
            return Refused(
                f"{where} refused the credentials for client {s.client_id}: "
                f"{exc.reason.lower()} — check its username and password against the broker's "
                "password file"
            )
        kind = Refused if exc.code in _REFUSALS else BrokerUnavailable
        return kind(f"{where} refused the connection of client {s.client_id}: {exc.reason}")
    if isinstance(exc, ConnectionLost):  # the end of an established connection
        why = {
            0x80: "it dropped",
            0x8D: "no answer within the keepalive",
            # Mosquitto 2.0 just closes the socket on a takeover; newer brokers say so.
            0x8E: f"another client connected as {s.client_id} — is this agent running twice?",
        }.get(exc.code, exc.reason)
        return BrokerUnavailable(f"lost the connection to {where}: {why}")
    return BrokerUnavailable(f"the MQTT connection to {where} failed: {exc}")


def tls_context(s: BrokerSettings) -> ssl.SSLContext | None:
    """Build the TLS context once, so missing or bad files fail before any connection."""
    if s.ca_file is None:
        return None
    try:
        context = ssl.create_default_context(cafile=str(s.ca_file))
        if s.cert_file is not None:
            context.load_cert_chain(s.cert_file, s.key_file)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(str(p) for p in (s.ca_file, s.cert_file, s.key_file) if p)
        raise Refused(f"cannot load the TLS files ({files}): {exc}") from None
    return context
