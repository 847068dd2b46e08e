"""Every (identity, topic) pair on a real Mosquitto, for acl_file and dynsec alike.

The expectations below are docs/topics.md written out independently of
vox_mqtt.acl, so a wrong generator cannot agree with itself. One broker per
format; every identity publishes on every topic of the universe once (QoS 1,
MQTT v5), and we record what the publisher was told (PUBACK), what every other
identity received, and what an independent `mosquitto_sub` witness saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

import pytest

from tests.kits.aclkit import Who, expected_read, expected_write, people, universe
from tests.kits.brokerkit import (
    GRANTED_QOS1,
    NOT_AUTHORIZED,
    Client,
    SecureBroker,
    Witness,
    seven_agent_fleet,
    start_secure_broker,
    try_connect,
)
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.protocol.hierarchy import Fleet

ALLOWED_PUBACK = {0x00, 0x10}  # success, or "no matching subscribers"


def probe_filters(who: Who, fleet: Fleet) -> dict[str, bool]:
    """Wildcard subscriptions and whether dynsec must grant them."""
    other = fleet.root.id if who.id != fleet.root.id else fleet.agent("coord_a").id
    return {
        f"vox/{who.id}/inbox/+": who.kind != "look",
        "vox/+/status": who.kind in ("operator", "look"),
        "vox/+/presence": who.kind in ("operator", "look"),
        "vox/warroom/#": who.kind in ("operator", "look") or who.id == fleet.root.id,
        f"vox/{other}/inbox/+": False,
        "vox/+/inbox/+": False,
        "vox/#": False,
        "#": False,
    }


@dataclass
class Observed:
    """Everything the matrix run saw."""

    secure: SecureBroker
    who: dict[str, Who]
    topics: list[str]
    fmt: str
    puback: dict[tuple[str, str], int] = field(default_factory=dict)
    live: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    witness: set[tuple[str, str]] = field(default_factory=set)
    retained: dict[str, set[str]] = field(default_factory=dict)
    retained_topics: set[str] = field(default_factory=set)
    suback: dict[str, dict[str, int]] = field(default_factory=dict)
    outside: dict[str, int] = field(default_factory=dict)


def _sentinel(obs: Observed, reader: str) -> tuple[str, str]:
    """Return (writer, topic) of a non-retained message reader may read."""
    who = obs.who[reader]
    if who.kind == "operator":
        root = obs.secure.fleet.root
        return root.name, f"vox/{who.id}/inbox/{root.id}"
    if who.kind == "look":  # reads every status, writes nothing: the root's will do
        root = obs.secure.fleet.root
        return root.name, f"vox/{root.id}/status"
    return reader, f"vox/{who.id}/status"


def _drain_to_sentinel(obs: Observed, clients: dict[str, Client], tag: str) -> None:
    for reader in clients:
        writer, topic = _sentinel(obs, reader)
        assert clients[writer].publish(topic, f"S|{reader}|{tag}".encode()) in ALLOWED_PUBACK
    for reader, client in clients.items():
        assert client.wait_payload(f"S|{reader}|{tag}".encode(), 10), f"{reader}: no sentinel"


def run_matrix(secure: SecureBroker, fmt: str) -> Observed:
    fleet = secure.fleet
    obs = Observed(secure=secure, who=people(fleet), topics=universe(fleet), fmt=fmt)
    clients = {name: Client(secure.creds(name)) for name in obs.who}
    witness = Witness(secure.creds("explorer"), "vox/#")
    try:
        for name, client in clients.items():
            assert client.connect() == 0, name
            filters = {**probe_filters(obs.who[name], fleet)}
            base = ["#"] if fmt == "acl" else obs.topics
            codes = client.subscribe([*base, *filters])
            obs.suback[name] = dict(zip([*base, *filters], codes, strict=True))
        root_client = clients[fleet.root.name]
        witness.sync(root_client, f"vox/{fleet.root.id}/status")

        # Live phase: everyone writes everywhere.
        for name, client in clients.items():
            codes = client.publish_many([(t, f"W|{name}".encode()) for t in obs.topics])
            obs.puback.update({(name, t): c for t, c in zip(obs.topics, codes, strict=True)})
            obs.outside[name] = client.publish("outside/vox", b"W")
        _drain_to_sentinel(obs, clients, "live")
        witness.sync(root_client, f"vox/{fleet.root.id}/status")
        for name, client in clients.items():
            obs.live[name] = {
                (m.payload.decode()[2:], m.topic)
                for m in client.messages
                if m.payload.startswith(b"W|")
            }
            client.messages.clear()
        obs.witness = {
            (line.split(" ", 1)[1][2:], line.split(" ", 1)[0])
            for line in witness.lines
            if " W|" in line
        }

        # Retained phase: one legitimate writer per writable topic, then fresh subscriptions.
        for topic in obs.topics:
            writer = next(
                (
                    n
                    for n in obs.who
                    if (n, topic) in obs.puback and obs.puback[(n, topic)] in ALLOWED_PUBACK
                ),
                None,
            )
            if writer is not None:
                assert clients[writer].publish(topic, b"R", retain=True) in ALLOWED_PUBACK
                obs.retained_topics.add(topic)
        for client in clients.values():
            client.messages.clear()
            client.subscribe(["#"] if fmt == "acl" else obs.topics)
        _drain_to_sentinel(obs, clients, "retained")
        for name, client in clients.items():
            obs.retained[name] = {m.topic for m in client.messages if m.retain}
        for topic in obs.retained_topics:  # leave no retained state behind
            writer = next(n for n in obs.who if obs.puback[(n, topic)] in ALLOWED_PUBACK)
            clients[writer].publish(topic, b"", retain=True)
    finally:
        witness.close()
        for client in clients.values():
            client.close()
    return obs


@pytest.fixture(scope="module", params=["acl", "dynsec"])
def secure(
    request: pytest.FixtureRequest,
    module_broker_factory: Callable[..., LocalBroker],
    tmp_path_factory: pytest.TempPathFactory,
) -> SecureBroker:
    fleet = seven_agent_fleet()
    out = tmp_path_factory.mktemp(f"matrix-{request.param}")
    return start_secure_broker(module_broker_factory, fleet, out, fmt=request.param)


@pytest.fixture(scope="module")
def observed(secure: SecureBroker) -> Observed:
    return run_matrix(secure, secure.dir.fmt)


def _root(obs: Observed) -> UUID:
    return obs.secure.fleet.root.id


def test_every_publish_gets_the_puback_the_design_demands(observed: Observed) -> None:
    wrong = [
        (name, topic, hex(code))
        for (name, topic), code in observed.puback.items()
        if (code in ALLOWED_PUBACK) != expected_write(observed.who[name], topic, _root(observed))
        or code not in ALLOWED_PUBACK | {NOT_AUTHORIZED}
    ]
    assert wrong == []
    assert len(observed.puback) == len(observed.who) * len(observed.topics)
    assert set(observed.outside.values()) == {NOT_AUTHORIZED}


def test_the_witness_saw_exactly_the_allowed_publishes(observed: Observed) -> None:
    allowed = {k for k, code in observed.puback.items() if code in ALLOWED_PUBACK}
    assert observed.witness == allowed
    # The matrix is not vacuous: both outcomes occur many times.
    assert 20 < len(allowed) < len(observed.puback) - 200


def test_every_identity_received_exactly_what_it_may_read(observed: Observed) -> None:
    allowed = {k for k, code in observed.puback.items() if code in ALLOWED_PUBACK}
    for name, who in observed.who.items():
        expected = {(w, t) for (w, t) in allowed if expected_read(who, t, _root(observed))}
        assert observed.live[name] == expected, name


def test_retained_messages_reach_only_those_who_may_read_them(observed: Observed) -> None:
    assert observed.retained_topics
    for name, who in observed.who.items():
        expected = {t for t in observed.retained_topics if expected_read(who, t, _root(observed))}
        assert observed.retained[name] == expected, name


def test_subscribe_refusal_depends_on_the_format(observed: Observed) -> None:
    fleet = observed.secure.fleet
    for name, who in observed.who.items():
        codes = observed.suback[name]
        if observed.fmt == "acl":
            # acl_file never refuses a SUBSCRIBE; it filters delivery (checked above).
            assert set(codes.values()) == {GRANTED_QOS1}, name
            continue
        for topic_filter, must_grant in probe_filters(who, fleet).items():
            want = GRANTED_QOS1 if must_grant else NOT_AUTHORIZED
            assert codes[topic_filter] == want, (name, topic_filter)
        for topic in observed.topics:
            want = GRANTED_QOS1 if expected_read(who, topic, _root(observed)) else NOT_AUTHORIZED
            assert codes[topic] == want, (name, topic)


def test_the_named_cases_of_the_issue(observed: Observed) -> None:
    f = observed.secure.fleet
    spec, sibling, coord = f.agent("spec_a1"), f.agent("spec_a2"), f.agent("coord_a")
    root, other_coord = f.root, f.agent("coord_b")
    name = spec.name
    # Cannot read a sibling's inbox, although its coordinator wrote there.
    assert (coord.name, f"vox/{sibling.id}/inbox/{coord.id}") in observed.witness
    assert (coord.name, f"vox/{sibling.id}/inbox/{coord.id}") not in observed.live[name]
    # Cannot write the root's inbox.
    assert observed.puback[(name, f"vox/{root.id}/inbox/{spec.id}")] == NOT_AUTHORIZED
    # Cannot write into an inbox under another sender's id (its master's, as a sibling).
    assert observed.puback[(name, f"vox/{coord.id}/inbox/{sibling.id}")] == NOT_AUTHORIZED
    assert observed.puback[(name, f"vox/{coord.id}/inbox/{spec.id}")] in ALLOWED_PUBACK
    # Cannot read the war room, nor a sibling's or a cousin's status.
    assert not any(t.startswith("vox/warroom/") for _, t in observed.live[name])
    assert (sibling.name, f"vox/{sibling.id}/status") in observed.witness
    assert (sibling.name, f"vox/{sibling.id}/status") not in observed.live[name]
    assert (sibling.name, f"vox/{sibling.id}/presence") not in observed.live[name]
    # Ignorance enforced: of its master, the presence only, never the full status (which
    # names the master's master and the siblings' commands); so for a coordinator too.
    assert (coord.name, f"vox/{coord.id}/status") in observed.witness
    assert (coord.name, f"vox/{coord.id}/status") not in observed.live[name]
    assert (coord.name, f"vox/{coord.id}/presence") in observed.live[name]
    assert (root.name, f"vox/{root.id}/status") not in observed.live[coord.name]
    assert (root.name, f"vox/{root.id}/presence") in observed.live[coord.name]
    assert (spec.name, f"vox/{spec.id}/status") in observed.live[coord.name]
    assert not any(root.name == w for w, _ in observed.live[name])
    # A coordinator cannot reach the other coordinator's children; the operator only the root.
    assert observed.puback[(coord.name, f"vox/{f.agent('spec_b1').id}/inbox/{coord.id}")] == (
        NOT_AUTHORIZED
    )
    op = f.operator_name
    assert observed.puback[(op, f"vox/{root.id}/inbox/{f.operator_id}")] in ALLOWED_PUBACK
    assert observed.puback[(op, f"vox/{other_coord.id}/inbox/{f.operator_id}")] == NOT_AUTHORIZED
    assert observed.puback[(op, f"vox/{f.operator_id}/status")] == NOT_AUTHORIZED


def _login(secure: SecureBroker, name: str, **changes: str) -> Credentials:
    creds = secure.creds(name)
    fields = {"username": creds.username, "password": creds.password, **changes}
    return Credentials(host=creds.host, port=creds.port, **fields)


def test_wrong_password_and_anonymous_are_refused(secure: SecureBroker, observed: Observed) -> None:
    assert try_connect(_login(secure, "spec_a1", password="not-the-secret")) >= 0x80  # type: ignore[operator]
    other = secure.creds("root").password
    assert try_connect(_login(secure, "spec_a1", password=other)) >= 0x80  # type: ignore[operator]
    assert try_connect(_login(secure, "spec_a1", username="", password="")) >= 0x80  # type: ignore[operator]
    anonymous = Client(secure.creds("spec_a1"), anonymous=True)
    try:
        assert anonymous.connect() >= 0x80
    finally:
        anonymous.close()
    assert try_connect(secure.creds("spec_a1")) == 0


def _crash_with_will(secure: SecureBroker, name: str, will_topic: str) -> None:
    client = Client(secure.creds(name), will=(will_topic, f"will-of-{name}".encode()))
    assert client.connect() == 0
    client.drop()


def test_wills_obey_the_write_acl(secure: SecureBroker, observed: Observed) -> None:
    f = secure.fleet
    spec = f.agent("spec_b1")
    witness = Witness(secure.creds("explorer"), "vox/#")
    root = Client(secure.creds("root"))
    try:
        assert root.connect() == 0
        witness.sync(root, f"vox/{f.root.id}/status")
        _crash_with_will(secure, "spec_b1", f"vox/{f.root.id}/status")
        _crash_with_will(secure, "spec_b1", f"vox/{f.agent('coord_b').id}/inbox/{f.root.id}")
        _crash_with_will(secure, "spec_b1", f"vox/{f.root.id}/presence")
        _crash_with_will(secure, "spec_b1", f"vox/{spec.id}/presence")
        assert witness.wait_line(f"vox/{spec.id}/presence will-of-spec_b1")
        witness.sync(root, f"vox/{f.root.id}/status")
        wills = [line for line in witness.lines if "will-of-" in line]
        assert wills == [f"vox/{spec.id}/presence will-of-spec_b1"]
    finally:
        root.close()
        witness.close()


def test_the_explorer_reads_vox_and_writes_nothing(
    secure: SecureBroker, observed: Observed
) -> None:
    explorer = Client(secure.creds("explorer"))
    try:
        assert explorer.connect() == 0
        codes = explorer.publish_many([(t, b"E") for t in observed.topics[::7]])
        assert set(codes) == {NOT_AUTHORIZED}
        granted = explorer.subscribe(["vox/#", "#"])
        want_hash = GRANTED_QOS1 if observed.fmt == "acl" else NOT_AUTHORIZED
        assert granted == [GRANTED_QOS1, want_hash]
    finally:
        explorer.close()
