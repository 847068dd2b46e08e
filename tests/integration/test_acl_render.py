"""The rules model, the two renderers, passwd hashes and credentials files, without a broker."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tests.kits.aclkit import expected_read, expected_write, people, universe
from tests.kits.brokerkit import fleet_toml, seven_agent_fleet, tree_fleet
from vox_mqtt.broker.acl import (
    EXPLORER_NAME,
    Kind,
    explorer_id,
    fleet_identities,
    render_acl_file,
    render_dynsec,
    sub_topic_problem,
    topic_matches,
)
from vox_mqtt.broker.aclcheck import check_dynsec, parse_acl_file
from vox_mqtt.broker.passwd import (
    Credentials,
    hash_password,
    load_credentials,
    parse_passwd,
    render_credentials,
    render_passwd,
)
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import parse_fleet


def test_the_rules_model_matches_design_section_3() -> None:
    fleet = seven_agent_fleet()
    who = people(fleet)
    for identity in fleet_identities(fleet):
        for topic in universe(fleet):
            expected = who[identity.name]
            assert identity.may_write(topic) == expected_write(expected, topic, fleet.root.id)
            assert identity.may_read(topic) == expected_read(expected, topic, fleet.root.id)


def test_the_explorer_reads_everything_under_vox_and_writes_nothing() -> None:
    fleet = seven_agent_fleet()
    explorer = fleet_identities(fleet, explorer=True)[-1]
    assert explorer.kind is Kind.EXPLORER
    assert explorer.name == EXPLORER_NAME
    # Stable for the fleet (its operator id), so secrets and certificates survive re-renders.
    assert explorer.id == explorer_id(parse_fleet(fleet_toml(fleet)))
    assert explorer.id != explorer_id(seven_agent_fleet())
    assert all(explorer.may_read(t) and not explorer.may_write(t) for t in universe(fleet))
    assert not explorer.may_read("other/topic")
    assert not explorer.may_read("$SYS/broker/uptime")


def test_the_acl_file_says_exactly_what_the_model_says() -> None:
    identities = fleet_identities(seven_agent_fleet(), explorer=True)
    parsed = parse_acl_file(render_acl_file(identities, header=["hello"]))
    assert parsed.warnings == ()
    assert not any(entry.pattern or entry.deny or entry.user is None for entry in parsed.entries)
    for identity in identities:
        got = [(e.topic, e.read, e.write) for e in parsed.rules_of(identity.username)]
        assert got == [(r.topic, r.read, r.write) for r in identity.rules]


def test_dynsec_denies_by_default_and_grants_subscribe_and_receive_together() -> None:
    identities = fleet_identities(seven_agent_fleet())
    hashes = {i.id: hash_password("pw") for i in identities}
    text = render_dynsec(identities, hashes)
    check_dynsec(text)
    doc = json.loads(text)
    assert not any(v for k, v in doc["defaultACLAccess"].items() if k != "unsubscribe")
    roles = {role["rolename"]: role["acls"] for role in doc["roles"]}
    for identity, client in zip(identities, doc["clients"], strict=True):
        assert client["username"] == identity.username
        assert hashes[identity.id].verify("pw")
        acls = roles[client["roles"][0]["rolename"]]
        for rule in identity.rules:
            kinds = {a["acltype"] for a in acls if a["topic"] == rule.topic}
            want = {"subscribePattern", "publishClientReceive"} if rule.read else set()
            want |= {"publishClientSend"} if rule.write else set()
            assert kinds == want, rule


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["clients"][0].update(salt="short"), "base64"),
        (lambda d: d["clients"][0]["roles"].append({"rolename": "nope"}), "unknown role"),
        (
            lambda d: d["roles"][0]["acls"].append({"acltype": "sub", "topic": "a", "allow": True}),
            "unknown acltype",
        ),
        (
            lambda d: d["roles"][0]["acls"].append(
                {"acltype": "publishClientSend", "topic": "a/#/b", "allow": True}
            ),
            "'#'",
        ),
        (lambda d: d["clients"].append(dict(d["clients"][0])), "defined twice"),
        (lambda d: d["clients"][0].update(iterations=0), "iterations"),
    ],
)
def test_check_dynsec_finds_what_the_plugin_would_trip_on(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    identities = fleet_identities(seven_agent_fleet())
    doc = json.loads(render_dynsec(identities, {i.id: hash_password("x") for i in identities}))
    mutate(doc)
    with pytest.raises(ConfigError, match=message):
        check_dynsec(json.dumps(doc))
    with pytest.raises(ConfigError, match="not valid JSON"):
        check_dynsec("{")


def test_an_operator_named_like_an_agent_is_refused() -> None:
    fleet = tree_fleet({"root": None, "operator": "root"})
    with pytest.raises(ConfigError, match="'operator' names an agent"):
        fleet_identities(fleet)
    explorer_fleet = tree_fleet({"root": None, "explorer": "root"})
    fleet_identities(explorer_fleet)
    with pytest.raises(ConfigError, match="'explorer'"):
        fleet_identities(explorer_fleet, explorer=True)


@pytest.mark.parametrize(
    ("filter_", "topic", "match"),
    [
        ("vox/a/inbox/+", "vox/a/inbox/b", True),
        ("vox/a/inbox/+", "vox/a/inbox/b/c", False),
        ("vox/a/inbox/+", "vox/a/inbox", False),
        ("vox/#", "vox", True),
        ("#", "vox/x", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("vox/+/status", "vox/a/status", True),
    ],
)
def test_topic_matches_like_mosquitto(filter_: str, topic: str, match: bool) -> None:
    assert topic_matches(filter_, topic) is match


def test_sub_topic_problem() -> None:
    assert sub_topic_problem("vox/+/x/#") is None
    assert sub_topic_problem("vox/a+") is not None
    assert sub_topic_problem("vox/#/a") is not None
    assert sub_topic_problem("x" * 65536) is not None


def test_our_hashes_read_mosquitto_passwd_output(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "alice", "s3cret"], check=True)
    entries, problems = parse_passwd(passwd.read_text())
    assert problems == []
    assert entries["alice"].verify("s3cret")
    assert not entries["alice"].verify("s3cret ")


def test_hash_format_is_mosquittos_7() -> None:
    pw = hash_password("pw", salt=b"0123456789ab")
    field = pw.passwd_field()
    assert field.startswith("$7$101$MDEyMzQ1Njc4OWFi$")
    assert len(base64.b64decode(field.split("$")[4])) == 64
    assert render_passwd({"u": pw}) == f"u:{field}\n"
    with pytest.raises(ValueError, match="password file"):
        render_passwd({"a:b": pw})
    with pytest.raises(ValueError, match="12-byte salt"):
        hash_password("pw", salt=b"short")
    _, problems = parse_passwd("u:$6$abc$def\nv:plain\n# comment\n")
    assert len(problems) == 2


def test_credentials_round_trip(tmp_path: Path) -> None:
    plain = Credentials(username="u", password='p"q\\', host="h", port=1883)
    path = tmp_path / "c.toml"
    path.write_text(render_credentials(plain, comment_lines=["who"]))
    assert load_credentials(path) == plain
    assert not plain.tls
    tls = Credentials(
        username="u",
        password="p",
        host="h",
        port=8883,
        ca_file=Path("/ca"),
        cert_file=Path("/c"),
        key_file=Path("/k"),
    )
    path.write_text(render_credentials(tls))
    assert load_credentials(path) == tls
    assert tls.client_id == "u"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("username = 'u'\nhost = 'h'\nport = 1\n", "`password` must be"),
        ("username = 'u'\npassword = 'p'\nhost = 'h'\nport = 0\n", "`port` must be"),
        ("username = 'u'\npassword = 'p'\nhost = 'h'\nport = 1\nextra = 1\n", "unknown key"),
        ("username = 'u'\npassword = 'p'\nhost = 'h'\nport = 1\n[tls]\nca = '/x'\n", "`cert`"),
        ("username = \n", "not valid TOML"),
    ],
)
def test_bad_credentials_files_say_what_is_wrong(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_credentials(path)
    assert all(str(path) in problem for problem in caught.value.problems)
    with pytest.raises(ConfigError, match="no such credentials file"):
        load_credentials(tmp_path / "missing.toml")


def test_fleet_toml_helper_round_trips() -> None:
    fleet = seven_agent_fleet()
    again = parse_fleet(fleet_toml(fleet))
    assert [(a.name, a.id, a.master_id) for a in again] == [
        (a.name, a.id, a.master_id) for a in fleet
    ]
