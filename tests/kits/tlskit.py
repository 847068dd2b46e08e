"""A TLS fleet rendered by `vox broker render --pki`, and TLS sessions that come and go.

Shared by the tests of reloading a TLS broker (docs/broker.md, "SIGHUP and TLS").
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tests.kits.brokerkit import Client as MqttClient
from tests.kits.brokerkit import add_agent, fleet_toml, seven_agent_fleet
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.pki import init_pki
from vox_mqtt.cli import main
from vox_mqtt.protocol.hierarchy import Fleet

BrokerFactory = Callable[..., LocalBroker]
SHORT_EXPIRY = 2  # seconds: offline sessions expire while the test runs
MOVERS = ("spec_a1", "spec_b1", "coord_b")


def wait_log(broker: LocalBroker, predicate: Callable[[str], bool], timeout: float) -> bool:
    """Wait until the broker's log satisfies predicate (or it died); False after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(broker.log_text()):
            return True
        if not broker.running:
            return False
        time.sleep(0.05)
    return False


class TlsFleet:
    """A fleet file, its PKI and a broker directory rendered by `vox broker render --pki`."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.small = seven_agent_fleet()
        self.grown = add_agent(self.small, "spec_a3", "coord_a")
        self.files = {"small": tmp_path / "small.toml", "grown": tmp_path / "grown.toml"}
        for key, fleet in (("small", self.small), ("grown", self.grown)):
            self.files[key].write_text(fleet_toml(fleet))
        self.pki = tmp_path / "pki"
        init_pki(self.pki, self.grown, explorer=True)
        self.root = tmp_path / "broker"
        self.port, self.tls_port = free_port(), free_port()
        assert self.render("grown", *extra) == 0

    def render(self, which: str, *extra: str) -> int:
        """Run `vox broker render` for the small or the grown fleet into the directory."""
        args = ["broker", "render", str(self.files[which]), "--out", str(self.root)]
        args += ["--port", str(self.port), "--tls-port", str(self.tls_port)]
        args += ["--pki", str(self.pki), "--explorer", "--user", getpass.getuser(), *extra]
        return main(args)

    def tls(self, name: str) -> Credentials:
        return CredentialStore(self.root).get(name)

    def plain(self, name: str) -> Credentials:
        creds = self.tls(name)
        return replace(creds, host="127.0.0.1", port=self.port, ca_file=None, cert_file=None)

    def start(self, factory: BrokerFactory) -> LocalBroker:
        return factory((self.root / "mosquitto.conf").read_text(), port=self.port)


def come_and_go(fleet: TlsFleet, name: str, fleet_now: Fleet, *, expiry: int) -> None:
    """Connect name over TLS with a persistent session, publish once, and leave it offline."""
    client = MqttClient(fleet.tls(name), tls=True, session_expiry=expiry)
    try:
        assert client.connect() == 0
        agent = fleet_now.agent(name)
        assert client.publish(f"vox/{agent.master_id}/inbox/{agent.id}", b"x") in (0x00, 0x10)
    finally:
        client.close()
