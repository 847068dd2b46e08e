"""Fleets over several brokers: the file's [[brokers]], placement, and what crosses each bridge."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from rich.console import Console

from tests.kits.fleetproc import REPO, child_env
from vox_mqtt.broker.acl import Kind
from vox_mqtt.broker.aclcheck import parse_acl_file
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.federation import (
    bridge_for,
    bridge_id,
    bridge_restart,
    bridges,
    broker_identities,
    intersect,
    link_map,
    link_owners,
    link_path,
    link_topic,
)
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli.looks import Reader
from vox_mqtt.cli.statusview import status_tree
from vox_mqtt.fleet.bundles import reconnect_settings
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import AgentLiveness
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import ConfigError, FleetError
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.protocol.sitelinks import (
    LINK_SETTLE,
    SITE_LINK_LOST,
    UNREACHABLE,
    LinkMap,
    LinkWatch,
    SiteLinkDuty,
)

OPERATOR = uuid4()


def federated_text(
    agents: dict[str, tuple[str | None, str | None]],
    brokers: dict[str, str | None],
    ids: dict[str, UUID] | None = None,
) -> str:
    """Return a fleet file: {agent: (master, broker or None)}, {broker: upstream or None}."""
    ids = ids if ids is not None else {}
    for name in agents:
        ids.setdefault(name, uuid4())
    parts = [f'[operator]\nname = "operator"\nid = "{OPERATOR}"\n']
    for name, upstream in brokers.items():
        line = "" if upstream is None else f'upstream = "{upstream}"\n'
        parts.append(f'[[brokers]]\nname = "{name}"\n{line}')
    for name, (master, broker) in agents.items():
        body = f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"\n'
        if master is not None:
            body += f'master_id = "{ids[master]}"\n'
        if broker is not None:
            body += f'broker = "{broker}"\n'
        parts.append(body)
    return "\n".join(parts)


CHAIN_BROKERS: dict[str, str | None] = {"core": None, "east": "core", "west": "east"}
CHAIN_AGENTS: dict[str, tuple[str | None, str | None]] = {
    "root": (None, None),
    "coord": ("root", "east"),
    "spec_e": ("coord", None),
    "spec_w": ("coord", "west"),
    "coord_core": ("root", None),
    "spec_core": ("coord_core", None),
}


@pytest.fixture
def chain() -> Fleet:
    return parse_fleet(federated_text(CHAIN_AGENTS, CHAIN_BROKERS))


def problems_of(text: str) -> list[str]:
    with pytest.raises(FleetError) as info:
        parse_fleet(text, source="f.toml")
    return info.value.problems


def test_a_file_without_brokers_is_one_broker_as_before() -> None:
    fleet = parse_fleet(federated_text({"root": (None, None), "a": ("root", None)}, {}))
    assert fleet.brokers == ()
    assert fleet.root_broker is None
    assert all(agent.broker is None for agent in fleet)
    assert bridges(fleet) == ()


def test_agents_live_on_their_broker_or_their_masters(chain: Fleet) -> None:
    placed = {agent.name: agent.broker for agent in chain}
    assert placed == {
        "root": "core",
        "coord": "east",
        "spec_e": "east",  # inherited from its master
        "spec_w": "west",
        "coord_core": "core",
        "spec_core": "core",
    }
    assert chain.root_broker == "core"


def test_errors_name_the_agent_or_broker_and_the_line() -> None:
    text = federated_text(
        {"root": (None, None), "a": ("root", "mars"), "b": ("root", None)},
        {"core": None, "east": "core"},
    )
    (problem,) = problems_of(text)
    assert problem.startswith("f.toml:")
    assert "agent 'a'" in problem
    assert "broker 'mars' is not a declared broker" in problem


def test_a_cycle_of_upstreams_and_several_roots_are_reported() -> None:
    agents: dict[str, tuple[str | None, str | None]] = {"root": (None, None)}
    cycle = problems_of(federated_text(agents, {"core": None, "a": "b", "b": "a"}))
    assert any("upstream cycle 'a' -> 'b' -> 'a'" in p for p in cycle)
    roots = problems_of(federated_text(agents, {"core": None, "other": None}))
    assert any("several root brokers" in p and "'core'" in p and "'other'" in p for p in roots)
    unknown = problems_of(federated_text(agents, {"core": None, "a": "nowhere"}))
    assert any("broker 'a': upstream 'nowhere' is not a declared broker" in p for p in unknown)
    selfish = problems_of(federated_text(agents, {"core": None, "a": "a"}))
    assert any("broker 'a': is its own upstream" in p for p in selfish)


def test_an_agent_its_master_cannot_reach_is_refused() -> None:
    # A master on a site cannot reach a child on the core, nor on a sibling site.
    brokers: dict[str, str | None] = {"core": None, "east": "core", "west": "core"}
    up = problems_of(
        federated_text({"root": (None, None), "c": ("root", "east"), "s": ("c", "core")}, brokers)
    )
    assert any("agent 's': on broker 'core', which its master 'c'" in p for p in up)
    sideways = problems_of(
        federated_text({"root": (None, None), "c": ("root", "east"), "s": ("c", "west")}, brokers)
    )
    assert any("agent 's': on broker 'west'" in p and "put it on 'east'" in p for p in sideways)


def test_bad_broker_tables_and_a_broker_key_without_brokers() -> None:
    text = federated_text({"root": (None, None)}, {"core": None})
    text = text.replace('name = "core"\n', 'name = "core"\nport = 70000\ncolour = "red"\n')
    problems = problems_of(text)
    assert any("broker 'core': port must be from 1 to 65535" in p for p in problems)
    assert any("broker 'core': unknown key 'colour'" in p for p in problems)
    lonely = problems_of(federated_text({"root": (None, "core")}, {}))
    assert any("broker 'core' is not declared (the file has no [[brokers]])" in p for p in lonely)


def test_intersect_is_the_filter_both_match() -> None:
    assert intersect("vox/+/status", "vox/a/status") == "vox/a/status"
    assert intersect("vox/warroom/a/+", "vox/warroom/#") == "vox/warroom/a/+"
    assert intersect("vox/a/inbox/+", "vox/a/inbox/b") == "vox/a/inbox/b"
    assert intersect("vox/a/status", "vox/b/status") is None
    assert intersect("vox/a/status", "vox/a/inbox/+") is None
    assert intersect("vox/#", "vox") == "vox"


def test_each_bridge_carries_exactly_what_must_cross(chain: Fleet) -> None:
    ids = {agent.name: agent.id for agent in chain}
    east = bridge_for(chain, "east")
    west = bridge_for(chain, "west")
    assert east is not None
    assert west is not None
    assert bridge_for(chain, "core") is None
    assert west.upstream == "east"
    # west <-> east: spec_w and its master coord, nothing else.
    assert set(west.out_topics) == {
        topics.inbox(ids["coord"], ids["spec_w"]),
        topics.status(ids["spec_w"]),  # coord and the operator watch it
        topics.presence(ids["spec_w"]),  # and its will
        topics.warroom(ids["spec_w"], ids["spec_w"]),  # its own incidents, toward the root
    }
    # Of its master, spec_w reads the presence only: coord's full status never crosses.
    assert set(west.in_topics) == {
        topics.inbox(ids["spec_w"], ids["coord"]),
        topics.presence(ids["coord"]),
    }
    # east -> core: coord's talk with root, every status and war-room post below (each about
    # its poster or the poster's child; coord also owns west's link), west's link state.
    assert set(east.out_topics) == {
        topics.inbox(ids["root"], ids["coord"]),
        *(topics.status(ids[n]) for n in ("coord", "spec_e", "spec_w")),
        *(topics.presence(ids[n]) for n in ("coord", "spec_e", "spec_w")),
        *(topics.warroom(ids[n], ids[n]) for n in ("coord", "spec_e", "spec_w")),
        *(topics.warroom(ids["coord"], ids[n]) for n in ("spec_e", "spec_w")),
        topics.warroom(ids["coord"], west.id),
        link_topic(west.id),
    }
    assert set(east.in_topics) == {
        topics.inbox(ids["coord"], ids["root"]),
        topics.presence(ids["root"]),
    }
    # Nothing of the core's own subtree (coord_core, spec_core) ever goes down a bridge.
    for topic in (*east.in_topics, *west.in_topics, *west.out_topics):
        assert str(ids["coord_core"]) not in topic
        assert str(ids["spec_core"]) not in topic


def test_a_site_identity_speaks_only_for_its_own_agents(chain: Fleet) -> None:
    ids = {agent.name: agent.id for agent in chain}
    core = {i.name: i for i in broker_identities(chain, "core")}
    looks = {name for name, i in core.items() if i.kind is Kind.LOOK}
    assert looks  # the operator's `vox status` and `vox watch` identities, on the core only
    assert all(core[n].may_read(link_topic(bridge_id(chain, "west"))) for n in looks)
    assert set(core) - looks == {"operator", "root", "coord_core", "spec_core", "bridge-east"}
    bridge = core["bridge-east"]
    assert bridge.kind is Kind.BRIDGE
    assert bridge.id == bridge_id(chain, "east")
    site_agents = {ids["coord"], ids["spec_e"], ids["spec_w"]}
    for rule in bridge.rules:
        if rule.write and not rule.topic.startswith("vox/link/"):
            # Every topic it may write names a site agent as the speaker.
            level = rule.topic.split("/")
            if level[1] == "warroom":
                speaker = level[2]
            else:
                speaker = level[3] if level[2] == "inbox" else level[1]
            assert UUID(speaker) in site_agents, rule.topic
    for agent in ("root", "coord_core", "spec_core"):
        assert not bridge.may_write(topics.status(ids[agent]))
        assert not bridge.may_write(topics.warroom(ids[agent], ids[agent]))
    assert not bridge.may_read(topics.inbox(ids["spec_core"], ids["coord_core"]))
    assert not bridge.may_write(topics.inbox(ids["coord_core"], ids["spec_core"]))
    # Masters and the operator may read the links between them and their children.
    assert core["root"].may_read(link_topic(bridge_id(chain, "east")))
    assert not core["root"].may_read(link_topic(bridge_id(chain, "west")))
    assert core["operator"].may_read(link_topic(bridge_id(chain, "west")))
    east = {i.name: i for i in broker_identities(chain, "east")}
    assert set(east) == {"coord", "spec_e", "bridge-west"}
    assert east["coord"].may_read(link_topic(bridge_id(chain, "west")))
    assert link_path(chain, "west", "core") == (bridge_id(chain, "west"), bridge_id(chain, "east"))


def test_render_writes_a_bridge_with_a_secret_only_the_broker_reads(
    chain: Fleet, tmp_path: Path
) -> None:
    user = getpass.getuser()
    core = render_broker_dir(chain, tmp_path / "core", broker="core", run_as_user=user)
    assert not (core.root / "bridge").exists()
    with pytest.raises(ConfigError, match="--upstream-dir"):
        render_broker_dir(chain, tmp_path / "east", broker="east", run_as_user=user)
    east = render_broker_dir(
        chain, tmp_path / "east", broker="east", upstream_dir=core.root, run_as_user=user
    )
    conf = east.conf.read_text()
    assert f"include_dir {east.root / 'bridge'}" in conf
    bridge_conf = (east.root / "bridge" / "bridge.conf").read_text()
    # Never world-readable (group-readable for the broker when rendered as root).
    assert (east.root / "bridge" / "bridge.conf").stat().st_mode & 0o007 == 0
    secret = core.credentials_for("bridge-east").password
    assert f"remote_password {secret}" in bridge_conf
    assert secret not in conf
    for line in (
        "bridge_protocol_version mqttv50",
        "cleansession false",
        "notifications true",
        f"notification_topic {link_topic(bridge_id(chain, 'east'))}",
        f"address 127.0.0.1:{core.port}",
    ):
        assert line in bridge_conf
    topic_lines = [ln for ln in bridge_conf.splitlines() if ln.startswith("topic ")]
    assert topic_lines
    assert all(ln.endswith((" out 1", " in 1")) for ln in topic_lines)
    # The core's ACL parses as Mosquitto parses it and holds the bridge's account.
    parsed = parse_acl_file((core.root / "acl").read_text())
    assert str(bridge_id(chain, "east")) in parsed.users
    # Each broker holds credentials only for its own clients (and its reload canary).
    assert sorted(east.identities) == ["_canary", "bridge-west", "coord", "spec_e"]
    assert sorted(CredentialStore(east.root).names()) == sorted(east.identities)
    with pytest.raises(ConfigError, match="choose one with --broker"):
        render_broker_dir(chain, tmp_path / "x", run_as_user=user)


def test_cli_render_and_tree_name_each_agents_broker(tmp_path: Path) -> None:
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(federated_text(CHAIN_AGENTS, CHAIN_BROKERS))

    def vox(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vox_mqtt.cli", *map(str, args)],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=REPO,
            timeout=60,
        )

    tree = vox("tree", fleet_path)
    assert tree.returncode == 0, tree.stderr
    assert "spec_w (id: " in tree.stdout
    assert "@ west" in tree.stdout
    assert "broker west: 127.0.0.1:1883 (TLS 8883), bridged to east, 1 agent(s)" in tree.stdout
    user = ["--user", getpass.getuser()]
    ok = vox("broker", "render", fleet_path, "--out", tmp_path / "core", "--broker", "core", *user)
    assert ok.returncode == 0, ok.stderr
    missing = vox("broker", "render", fleet_path, "--out", tmp_path / "east", "--broker", "east")
    assert missing.returncode == 2
    assert "--upstream-dir" in missing.stderr
    assert "Traceback" not in missing.stderr
    east = vox(
        "broker", "render", fleet_path, "--out", tmp_path / "east", "--broker", "east",
        "--upstream-dir", tmp_path / "core", "--json", *user,
    )  # fmt: skip
    assert east.returncode == 0, east.stderr
    rendered = json.loads(east.stdout)
    assert rendered["broker"] == "east"
    assert rendered["bridge"]["upstream"] == "core"
    assert rendered["bridge"]["out"]
    assert rendered["bridge"]["in"]
    wrong = vox(
        "agent", "render", fleet_path, "coord", "--broker-dir", tmp_path / "core",
        "--out", tmp_path / "etc" / "coord.toml",
    )  # fmt: skip
    assert wrong.returncode == 2
    assert "'coord' connects to broker 'east'" in wrong.stderr


def test_link_maps_tell_each_identity_only_its_own_links(chain: Fleet) -> None:
    ids = {agent.name: agent.id for agent in chain}
    east, west = bridge_id(chain, "east"), bridge_id(chain, "west")
    owners = link_owners(chain)
    assert owners == {east: ids["root"], west: ids["coord"]}
    operator = link_map(chain, chain.operator_id)
    assert operator is not None
    behind = {link.site: set(link.behind) for link in operator.links}
    assert behind == {
        "east": {ids["coord"], ids["spec_e"], ids["spec_w"]},
        "west": {ids["spec_w"]},
    }
    assert not any(link.owner for link in operator.links)
    root = link_map(chain, ids["root"])
    assert root is not None
    assert [(link.site, set(link.behind), link.owner) for link in root.links] == [
        ("east", {ids["coord"]}, True)
    ]
    coord = link_map(chain, ids["coord"])
    assert coord is not None
    assert [(link.site, set(link.behind), link.owner) for link in coord.links] == [
        ("west", {ids["spec_w"]}, True)
    ]
    spec = link_map(chain, ids["spec_core"])
    assert spec is not None
    assert spec.links == ()
    assert LinkMap.from_json(json.loads(json.dumps(operator.as_json()))) == operator
    assert link_map(parse_fleet(federated_text({"root": (None, None)}, {})), OPERATOR) is None
    # The owner may post the one incident; the war-room post crosses up to the root.
    on_east = {i.name: i for i in broker_identities(chain, "east")}
    assert on_east["coord"].may_write(topics.warroom(ids["coord"], west))
    bridge = bridge_for(chain, "east")
    assert bridge is not None
    assert any(intersect(t, topics.warroom(ids["coord"], west)) for t in bridge.out_topics)


def test_a_link_watch_marks_who_is_behind_a_lost_link(chain: Fleet) -> None:
    ids = {agent.name: agent.id for agent in chain}
    operator = link_map(chain, chain.operator_id)
    assert operator is not None
    watch = LinkWatch(operator)
    east = link_topic(bridge_id(chain, "east"))
    west = link_topic(bridge_id(chain, "west"))
    assert watch.take(east, b"1") == (bridge_id(chain, "east"), True)
    assert watch.take(east, b"1") is None  # no change
    assert watch.take("vox/link/not-a-uuid", b"0") is None
    assert watch.take(f"vox/{ids['root']}/status", b"0") is None
    assert watch.lost_via(ids["spec_w"]) is None
    assert watch.take(west, b"0") == (bridge_id(chain, "west"), False)
    lost = watch.lost_via(ids["spec_w"])
    assert lost is not None
    assert lost.site == "west"
    assert watch.lost_via(ids["coord"]) is None
    entries = [AgentLiveness(id=ids["spec_w"], status="ACTIVE"), AgentLiveness(id=ids["coord"])]
    shown = watch.overlay(entries)
    assert (shown[0].status, shown[0].error_code) == (UNREACHABLE, SITE_LINK_LOST)
    assert entries[0].status == "ACTIVE"  # the view itself is left alone
    assert shown[1] is entries[1]


def test_vox_watch_draws_agents_behind_a_lost_link_unreachable(chain: Fleet) -> None:
    operator = link_map(chain, chain.operator_id)
    assert operator is not None
    reader = Reader(
        kind="operator",
        name="operator",
        id=chain.operator_id,
        top=chain.operator_id,
        top_name="operator",
        peers=(),
        warroom=True,
        stale_after=3.0,
        broker=BrokerSettings(host="127.0.0.1", port=1, username="u", password="p", client_id="c"),
        links=operator,
    )
    observer = FleetObserver()
    for agent in chain:
        entry = observer.view.watch(agent.id, agent.name)
        entry.status, entry.last_heartbeat = "ACTIVE", "2026-01-01T00:00:00.000Z"
        entry.master_id = chain.master_of(agent.id)
    watch = reader.link_watch()
    assert watch is not None
    watch.take(link_topic(bridge_id(chain, "west")), b"0")
    console = Console(record=True, width=300)
    console.print(status_tree(reader, observer, watch))
    text = console.export_text()
    assert "spec_w UNREACHABLE SITE_LINK_LOST" in text
    assert "coord ACTIVE" in text
    assert "site west: bridge link lost (SITE_LINK_LOST)" in text


def test_a_master_holds_per_agent_incidents_only_while_the_site_is_to_blame(chain: Fleet) -> None:
    ids = {agent.name: agent.id for agent in chain}
    links = link_map(chain, ids["coord"])
    assert links is not None
    now = [100.0]
    duty = SiteLinkDuty(links, clock=lambda: now[0])
    west = link_topic(bridge_id(chain, "west"))
    spec_w, old_status = ids["spec_w"], 0.0
    # First news that a link is up starts no grace: a lost child is its own incident.
    assert duty.take(west, b"1") is not None
    assert not duty.holds(spec_w, old_status, grace=45)
    # A fresh loss waits LINK_SETTLE for the link's own news (a stopping site's wills).
    assert duty.holds(spec_w, now[0] - 1, grace=45)
    assert not duty.holds(spec_w, now[0] - LINK_SETTLE - 0.1, grace=45)
    # Down: the site's one incident stands for it; this agent owns it.
    change = duty.take(west, b"0")
    assert change is not None
    assert change[0].site == "west"
    assert change[1] is False
    assert duty.holds(spec_w, old_status, grace=45)
    assert [link.site for link in duty.owned_down()] == ["west"]
    # Back: its agents get the grace to be reborn, then count for themselves again.
    duty.take(west, b"1")
    assert duty.known_up(bridge_id(chain, "west"))
    now[0] += 44
    assert duty.holds(spec_w, old_status, grace=45)
    now[0] += 2
    assert not duty.holds(spec_w, old_status, grace=45)
    assert not duty.holds(ids["spec_e"], old_status, grace=45)  # not behind any link of coord


def test_bridges_and_agents_come_back_on_a_backoff_sized_to_the_fleet(
    chain: Fleet, tmp_path: Path
) -> None:
    """docs/federation.md, "Restarts and partitions": restart_timeout and reconnect_min."""
    user = getpass.getuser()
    core = render_broker_dir(chain, tmp_path / "core", broker="core", run_as_user=user)
    east = render_broker_dir(
        chain, tmp_path / "east", broker="east", upstream_dir=core.root, run_as_user=user
    )
    assert "restart_timeout 1 10\n" in (east.root / "bridge" / "bridge.conf").read_text()
    links = link_map(chain, chain.agent("coord").id)
    assert links is not None
    assert [link.restart_cap for link in links.links] == [10]
    # A big fleet: 2 sites of 3,000 agents under one core, 20 on the core itself.
    agents: dict[str, tuple[str | None, str | None]] = {"root": (None, None)}
    agents |= {f"c{n}": ("root", None) for n in range(19)}
    for site in ("a", "b"):
        agents[f"{site}-n0"] = ("root", site)
        agents |= {f"{site}-n{n}": (f"{site}-n{n // 100}", site) for n in range(1, 3000)}
    big = parse_fleet(federated_text(agents, {"core": None, "a": "core", "b": "core"}))
    # Both bridges into the core carry 6,000 agents' births: a cap of 6,000 / 500 s.
    assert bridge_restart(big, "a") == bridge_restart(big, "b") == (1, 12)
    # Each agent's first try spreads over agents on its broker / 500 s, at least 0.5 s.
    assert reconnect_settings(big, "a") == {"reconnect_min": 6.0, "reconnect_max": 30.0}
    assert reconnect_settings(big, "core") == {"reconnect_min": 0.5, "reconnect_max": 30.0}


def test_a_link_remembers_when_it_went_down(chain: Fleet) -> None:
    links = link_map(chain, chain.agent("coord").id)
    assert links is not None
    now = [5.0]
    duty = SiteLinkDuty(links, clock=lambda: now[0])
    west = bridge_id(chain, "west")
    assert duty.down_since(west) is None
    duty.take(link_topic(west), b"1")
    assert duty.down_since(west) is None
    now[0] = 7.0
    duty.take(link_topic(west), b"0")
    now[0] = 9.0
    duty.take(link_topic(west), b"0")  # the same news again changes nothing
    assert duty.down_since(west) == 7.0
