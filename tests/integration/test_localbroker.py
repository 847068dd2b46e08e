"""The broker fixture runs a real Mosquitto that independent clients can use."""

from __future__ import annotations

import subprocess

import pytest

from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.protocol.errors import BrokerUnavailable


def test_real_broker_carries_a_message(plain_broker: LocalBroker) -> None:
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(plain_broker.port),
            "-t",
            "vox/t",
            "-C",
            "1",
            "-W",
            "10",
        ],
        stdout=subprocess.PIPE,
    )
    # Retained, so the witness sees it however the two clients race.
    subprocess.run(
        [
            "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(plain_broker.port),
            "-t",
            "vox/t",
            "-m",
            "hello",
            "-r",
            "-q",
            "1",
        ],
        check=True,
        timeout=10,
    )
    out, _ = sub.communicate(timeout=15)
    assert out.strip() == b"hello"


def test_bad_config_reports_the_broker_log(broker_factory) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BrokerUnavailable, match="exited"):
        broker_factory("listener {port} 127.0.0.1\nthis_is_not_an_option true\n")


def test_restart_keeps_the_port(plain_broker: LocalBroker) -> None:
    pid = plain_broker.pid
    plain_broker.restart()
    assert plain_broker.running
    assert plain_broker.pid != pid
