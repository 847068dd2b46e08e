"""BlockingSession: the session for a synchronous caller, against a real Mosquitto."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.kits.sessionkit import Factory, conf, settings
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.protocol.errors import BrokerUnavailable, Refused
from vox_mqtt.transport.blocking import BlockingSession


def threads() -> set[int]:
    return {thread.ident or 0 for thread in threading.enumerate()}


def plain_value(value: object) -> bool:
    """Tell whether a property value is made of the language's own types only."""
    if isinstance(value, list | tuple):
        return all(plain_value(item) for item in value)
    return isinstance(value, str | int)


def test_publish_receive_and_close_leave_no_thread(plain_broker: LocalBroker) -> None:
    before = threads()
    with BlockingSession(settings(plain_broker.port), subscriptions=["b/#"]) as session:
        assert session.connected
        outcome = session.publish("b/x", b'{"n": 1}', content_type="application/json")
        assert outcome.accepted, outcome
        assert outcome.code == 0x00
        message = session.receive(timeout=10)
        assert message is not None
        assert (message.topic, message.payload) == ("b/x", b'{"n": 1}')
        assert message.properties == {"content_type": "application/json"}
        assert all(plain_value(value) for value in message.properties.values())
        unheard = session.publish("nobody/listens", b"")
        assert (unheard.accepted, unheard.code) == (True, 0x10)
    assert not session.connected
    session.close()  # again: nothing left to do
    assert threads() <= before


def test_a_refused_publish_is_an_outcome_and_the_session_goes_on(
    broker_factory: Factory, tmp_path: Path
) -> None:
    (tmp_path / "acl").write_text("topic readwrite allowed/#\n")
    broker = broker_factory(conf("allow_anonymous true", f"acl_file {tmp_path}/acl"))
    with BlockingSession(settings(broker.port)) as session:
        refused = session.publish("forbidden/x", b"")
        assert refused.refused
        assert refused.code == 0x87
        assert "Not authorized" in str(refused.error("forbidden/x"))
        assert session.publish("allowed/x", b"").accepted


def test_one_attempt_a_refusal_or_no_broker_raises_at_once(
    broker_factory: Factory, tmp_path: Path
) -> None:
    before = threads()
    port = free_port()
    # No retry until connect_timeout: the first failure is the answer.
    with (
        pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{port}: connection refused"),
        BlockingSession(settings(port, connect_timeout=60.0)),
    ):
        pass
    passwd = tmp_path / "passwd"
    passwd.write_text("")
    broker = broker_factory(conf("allow_anonymous false", f"password_file {passwd}"))
    bad = settings(broker.port, client_id="canary-7", username="canary", password="wrong")
    with pytest.raises(Refused, match="refused the credentials for client canary-7"):
        BlockingSession(bad).__enter__()
    assert threads() <= before


def test_a_dropped_connection_ends_the_session(broker_factory: Factory) -> None:
    broker = broker_factory()
    with BlockingSession(settings(broker.port), subscriptions=["d/#"]) as session:
        broker.stop()
        outcome = session.publish("d/x", b"", timeout=10)
        assert outcome.lost, outcome
        # Ended: receive says so at once instead of waiting out its timeout.
        assert session.receive(timeout=600) is None
        assert not session.connected


async def test_a_synchronous_caller_inside_a_running_loop(plain_broker: LocalBroker) -> None:
    """A command run from an event loop (`vox broker reload` from a test, say) still works:
    the session runs on its own loop, and this one waits, as for any blocking call."""
    before = threads()
    with BlockingSession(settings(plain_broker.port), subscriptions=["l/#"]) as session:
        assert session.publish("l/x", b"here").accepted
        message = session.receive(timeout=10)
        assert message is not None
        assert message.payload == b"here"
    assert threads() <= before
