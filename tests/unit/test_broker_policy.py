"""The fleet's policy as probes, and the rules' answers to them (acl_file and dynsec)."""

from __future__ import annotations

import json
from dataclasses import replace

from tests.kits.brokerkit import seven_agent_fleet
from vox_mqtt.broker.acl import (
    Identity,
    Rule,
    fleet_identities,
    render_acl_file,
)
from vox_mqtt.broker.aclcheck import parse_acl_file
from vox_mqtt.broker.policy import (
    MAX_PROBES_PER_IDENTITY,
    acl_allows,
    dynsec_allows,
    policy_probes,
    policy_problems,
    rendered_acl_problems,
)
from vox_mqtt.protocol.errors import ConfigError


def test_probes_are_bounded_and_the_rendered_acl_holds_them() -> None:
    identities = fleet_identities(seven_agent_fleet(), explorer=True)
    probes = policy_probes(identities)
    for identity in identities:
        mine = [p for p in probes if p.user == identity.username]
        assert 0 < len(mine) <= MAX_PROBES_PER_IDENTITY
        assert any(p.allowed for p in mine)
        assert any(not p.allowed for p in mine)
    acl = parse_acl_file(render_acl_file(identities))
    assert policy_problems(probes, lambda u, t, w: acl_allows(acl, u, t, w)) == (0, [])


def test_an_acl_that_opens_a_path_or_closes_one_is_caught() -> None:
    identities = fleet_identities(seven_agent_fleet())
    probes = policy_probes(identities)
    text = render_acl_file(identities)
    opened = parse_acl_file(text + "pattern readwrite vox/#\n")
    wrong, lines = policy_problems(probes, lambda u, t, w: acl_allows(opened, u, t, w))
    assert wrong > 0
    assert "must be forbidden" in lines[0]
    first = identities[0]
    closed = parse_acl_file(
        text.replace(f"user {first.username}\n", f"user {first.username}\ntopic deny #\n")
    )
    wrong, lines = policy_problems(probes, lambda u, t, w: acl_allows(closed, u, t, w))
    assert wrong > 0
    assert "must be allowed" in lines[0]


def test_dynsec_answers_by_role_then_default() -> None:
    document = {
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False},
        "clients": [{"username": "a", "roles": [{"rolename": "r"}]}],
        "roles": [
            {
                "rolename": "r",
                "acls": [
                    {"acltype": "publishClientSend", "topic": "vox/a/#", "allow": True},
                    {"acltype": "subscribePattern", "topic": "vox/b/+", "allow": True},
                    {"acltype": "publishClientReceive", "topic": "vox/b/+", "allow": True},
                ],
            }
        ],
    }
    assert dynsec_allows(document, "a", "vox/a/x", True)
    assert not dynsec_allows(document, "a", "vox/b/x", True)
    assert dynsec_allows(document, "a", "vox/b/x", False)
    assert not dynsec_allows(document, "nobody", "vox/a/x", True)
    opened = json.loads(json.dumps(document))
    opened["defaultACLAccess"]["publishClientSend"] = True
    assert dynsec_allows(opened, "a", "vox/z", True)


def test_each_agent_is_probed_not_to_read_its_masters_status() -> None:
    fleet = seven_agent_fleet()
    identities = fleet_identities(fleet)
    probes = policy_probes(identities)
    for agent in fleet:
        master = fleet.master_of(agent.id)
        wanted = f"vox/{master}/status"
        mine = [p for p in probes if p.user == str(agent.id) and p.topic == wanted]
        assert [(p.write, p.allowed) for p in mine] == [(False, False)], agent.name
    # An ACL widened by hand to let a specialist read its coordinator's status is refused.
    spec, coord = fleet.agent("spec_a1"), fleet.agent("coord_a")
    text = render_acl_file(identities).replace(
        f"user {spec.id}\n", f"user {spec.id}\ntopic read vox/{coord.id}/status\n"
    )
    widened = parse_acl_file(text)
    wrong, lines = policy_problems(probes, lambda u, t, w: acl_allows(widened, u, t, w))
    assert wrong == 1
    assert f"read vox/{coord.id}/status must be forbidden" in lines[0]


def test_probe_answers_are_the_rules_answers() -> None:
    # The probes' indexed lookup answers as Identity.may_read / may_write walk the rules.
    identities = fleet_identities(seven_agent_fleet(), explorer=True)
    probes = policy_probes(identities)
    by_user = {identity.username: identity for identity in identities}
    assert probes
    for probe in probes:
        who = by_user[probe.user]
        expected = who.may_write(probe.topic) if probe.write else who.may_read(probe.topic)
        assert probe.allowed == expected, probe.text()


def _with_rule(identity: Identity, topic: str) -> Identity:
    return replace(identity, rules=(*identity.rules, Rule(topic=topic, read=True)))


def test_the_rendered_rules_check_refuses_what_the_full_parse_refuses() -> None:
    identities = fleet_identities(seven_agent_fleet(), explorer=True)
    text = render_acl_file(identities)
    assert not parse_acl_file(text).warnings
    assert rendered_acl_problems(identities) == []
    first = identities[0]
    bad = {
        "vox/a#": "invalid topic",
        "vox/+x/status": "invalid topic",
        "vox/a ": "spaces or control",
        " vox/a": "spaces or control",
        "": "spaces or control",
        "vox/a\nuser x": "spaces or control",
        "vox/a\tb": "spaces or control",
    }
    for topic, reason in bad.items():
        changed = (_with_rule(first, topic), *identities[1:])
        problems = rendered_acl_problems(changed)
        assert len(problems) == 1, (topic, problems)
        assert reason in problems[0], (topic, problems)
        # The full parse as Mosquitto reads it refuses the same file, or warns on it, or
        # reads a different rule than the identity's.
        try:
            parsed = parse_acl_file(render_acl_file(changed))
        except ConfigError:
            continue
        assert parsed.warnings or topic not in {e.topic for e in parsed.rules_of(first.username)}
    renamed = (replace(first, name="op\ntopic readwrite #"), *identities[1:])
    assert "control characters" in rendered_acl_problems(renamed)[0]
    # Mosquitto would read a rule no identity has (the injected line): a whole-file grant.
    injected = parse_acl_file(render_acl_file(renamed))
    assert len(injected.entries) == sum(len(i.rules) for i in identities) + 1
