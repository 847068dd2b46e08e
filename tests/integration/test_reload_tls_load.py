"""A TLS broker reloaded again and again under client load stays up (and the reload says so)."""

from __future__ import annotations

import getpass
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.brokerkit import Client, SecureBroker, add_agent, seven_agent_fleet, try_connect
from vox_mqtt.broker.pki import init_pki
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli import main

SecureFactory = Callable[..., SecureBroker]
ROUNDS = 20


class Load:
    """Persistent TLS clients publishing to their master's inbox until stopped."""

    def __init__(self, secure: SecureBroker, names: tuple[str, ...]) -> None:
        self.clients = [Client(secure.tls_creds(n), tls=True, session_expiry=600) for n in names]
        self.topics = []
        for name, client in zip(names, self.clients, strict=True):
            agent = secure.fleet.agent(name)
            self.topics.append(f"vox/{agent.master_id}/inbox/{agent.id}")
            assert client.connect() == 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for client, topic in zip(self.clients, self.topics, strict=True):
                try:
                    client.publish(topic, b"load")
                    self.sent += 1
                except TimeoutError:
                    pass
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        for client in self.clients:
            client.close()


@pytest.mark.slow
def test_a_tls_broker_survives_repeated_reloads_under_load(
    secure_broker_factory: SecureFactory, tmp_path: Path
) -> None:
    """F2: Mosquitto 2.0.11 with TLS segfaulted on SIGHUP (4 times in two rounds elsewhere)."""
    fleet = seven_agent_fleet()
    grown = add_agent(fleet, "spec_a3", "coord_a")
    pki = tmp_path / "pki"
    init_pki(pki, grown, explorer=True)
    secure = secure_broker_factory(fleet, pki_dir=pki)
    load = Load(secure, ("spec_a1", "spec_b1", "coord_b"))
    try:
        for round_ in range(ROUNDS):
            secure.dir = render_broker_dir(
                grown if round_ % 2 == 0 else fleet,
                secure.dir.root,
                port=secure.dir.port,
                tls_port=secure.dir.tls_port or 0,
                pki_dir=pki,
                explorer=True,
                run_as_user=getpass.getuser(),
            )
            code = main(["broker", "reload", str(secure.dir.root), "--pid", str(secure.broker.pid)])
            assert code == 0, f"round {round_}: reload failed"
            assert secure.broker.running, f"round {round_}: the broker died"
            # A look (`vox status`) and an operator's command connect over TLS in between.
            assert try_connect(secure.tls_creds("_status"), tls=True) == 0
            assert try_connect(secure.tls_creds("operator"), tls=True) == 0
    finally:
        load.close()
    assert secure.broker.running
    assert load.sent > ROUNDS
    assert secure.broker.log_text().count("Reloading config") == ROUNDS
