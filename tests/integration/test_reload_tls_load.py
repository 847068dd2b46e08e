"""F2: a TLS broker changed again and again while persistent sessions come and go stays up.

Mosquitto 2.0 (2.0.11 here) crashes some seconds after a SIGHUP on a listener with
`use_identity_as_username` while a persistent session is offline: the reload
disconnects that offline session a second time and puts it on the session-expiry
list twice; the stale entry is freed memory by the time it is due (docs/broker.md,
"SIGHUP and TLS"). So a TLS broker is rendered for dynsec by default and changed live,
and `vox broker reload` refuses to SIGHUP an acl-format TLS broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.brokerkit import Client as MqttClient
from tests.kits.brokerkit import try_connect
from tests.kits.tlskit import (
    MOVERS,
    SHORT_EXPIRY,
    BrokerFactory,
    TlsFleet,
    come_and_go,
    wait_log,
)
from vox_mqtt.cli import main

ROUNDS = 20


@pytest.mark.slow
def test_a_tls_broker_takes_20_changes_while_persistent_sessions_come_and_go(
    broker_factory: BrokerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reload pattern that crashed 2.0.11: offline sessions, a reload, reconnects."""
    fleet = TlsFleet(tmp_path)
    broker = fleet.start(broker_factory)
    for round_ in range(ROUNDS):
        for name in MOVERS:  # offline persistent sessions at the moment of the change
            come_and_go(fleet, name, fleet.small, expiry=SHORT_EXPIRY if round_ % 2 else 600)
        assert fleet.render("small" if round_ % 2 else "grown") == 0
        code = main(["broker", "reload", str(fleet.root), "--pid", str(broker.pid)])
        assert code == 0, f"round {round_}: {capsys.readouterr().err}"
        for name in MOVERS:  # reconnects take the offline sessions over
            come_and_go(fleet, name, fleet.small, expiry=SHORT_EXPIRY)
        assert try_connect(fleet.tls("_status"), tls=True) == 0
        assert broker.running, f"round {round_}: the broker died"
    # The short sessions expire while the broker runs: where 2.0.11 crashed.
    assert wait_log(broker, lambda log: "Expiring client" in log, 10), broker.log_tail()
    code = main(["broker", "reload", str(fleet.root), "--pid", str(broker.pid), "--watch", "3"])
    assert code == 0, capsys.readouterr().err
    assert "watched 3 s: still up" in capsys.readouterr().out
    assert broker.running
    assert "Reloading config" not in broker.log_text()  # no SIGHUP was ever sent


def test_an_acl_tls_broker_is_not_signalled(
    broker_factory: BrokerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TlsFleet(tmp_path, "--format", "acl")
    assert "acl format with TLS" in capsys.readouterr().err
    broker = fleet.start(broker_factory)
    come_and_go(fleet, "spec_a1", fleet.small, expiry=SHORT_EXPIRY)
    assert main(["broker", "reload", str(fleet.root), "--pid", str(broker.pid)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"vox: error: {fleet.root}/mosquitto.conf: refusing to SIGHUP a TLS")
    assert "--format dynsec" in line
    assert "Reloading config" not in broker.log_text()
    assert broker.running


def test_a_tls_sighup_disconnects_an_offline_session_again(
    broker_factory: BrokerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Why: the crash's first step, seen in the broker's own log (the plain listener is spared).

    `Client X disconnected.` logged by the reload for an X that is already offline is the
    second `context__disconnect` of that session, which adds it to the expiry list again.
    """
    fleet = TlsFleet(tmp_path, "--format", "acl")
    broker = fleet.start(broker_factory)
    tls_id, plain_id = fleet.tls("spec_a1").username, fleet.tls("spec_b1").username
    come_and_go(fleet, "spec_a1", fleet.small, expiry=600)
    plain = MqttClient(fleet.plain("spec_b1"), session_expiry=600)
    assert plain.connect() == 0
    plain.close()
    offline = broker.log_text().count(f"Client {tls_id} disconnected.")
    capsys.readouterr()
    args = ["broker", "reload", str(fleet.root), "--pid", str(broker.pid), "--tls-sighup"]
    assert main(args) == 0, capsys.readouterr().err
    assert wait_log(broker, lambda log: "Reloading config" in log, 5)
    after = broker.log_text().split("Reloading config.", 1)[1]
    assert after.count(f"Client {tls_id} disconnected.") == 1
    assert broker.log_text().count(f"Client {tls_id} disconnected.") == offline + 1
    assert f"Client {plain_id} disconnected." not in after
