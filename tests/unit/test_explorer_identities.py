"""Explorers, several at once (issue 38, item 5): one read-only identity per person or tool.

The pure part: names, ids, rules, the acl_file and dynsec.json blocks; then `vox broker
render --explorer NAME` (repeatable, remembered, --no-explorer), `vox pki init --explorer
NAME` and `vox agent render explorer-NAME` from the command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid5

import pytest

from tests.kits.aclkit import universe
from tests.kits.brokerkit import fleet_toml, seven_agent_fleet, tree_fleet
from tests.kits.federationkit import federated_fleet_text
from vox_mqtt.broker.acl import (
    EXPLORER_NAME,
    Kind,
    explorer_id,
    explorer_names,
    fleet_identities,
    render_acl_file,
    render_dynsec,
)
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.federation import broker_identities
from vox_mqtt.broker.manifest import load_manifest
from vox_mqtt.broker.passwd import hash_password
from vox_mqtt.broker.pki import PkiLayout
from vox_mqtt.cli import main
from vox_mqtt.cli.agent import resolve_agent
from vox_mqtt.fleet.explorer import load_explorer_config
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import load_fleet, parse_fleet


def test_names_are_normalized_sorted_and_deduplicated() -> None:
    given = ["bob", "explorer-alice", "alice", EXPLORER_NAME, "tool.2"]
    assert explorer_names(given) == (
        "explorer",
        "explorer-alice",
        "explorer-bob",
        "explorer-tool.2",
    )
    assert explorer_names([]) == ()


@pytest.mark.parametrize("bad", ["", "a b", "-x", "explorer-", "x" * 65, "é", "a/b", "a\nb"])
def test_a_bad_name_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        explorer_names(["fine", bad])
    assert len(caught.value.problems) == 1
    assert "\n" not in caught.value.problems[0].replace(repr(bad), "")
    assert repr(bad) in caught.value.problems[0]


def test_each_explorer_has_a_stable_id_of_its_own_and_reads_only() -> None:
    fleet = seven_agent_fleet()
    identities = fleet_identities(fleet, explorer=True, explorers=["alice", "bob"])
    explorers = [i for i in identities if i.kind is Kind.EXPLORER]
    assert [i.name for i in explorers] == ["explorer", "explorer-alice", "explorer-bob"]
    # The unnamed explorer keeps the id it always had: its secret and certificate survive.
    assert explorers[0].id == uuid5(fleet.operator_id, "vox-mqtt read-only explorer")
    assert len({i.username for i in identities}) == len(identities)
    again = fleet_identities(parse_fleet(fleet_toml(fleet)), explorers=["explorer-bob"])
    assert [i.id for i in again if i.kind is Kind.EXPLORER] == [explorers[2].id]
    assert explorer_id(fleet, "explorer-bob") != explorer_id(
        tree_fleet({"r": None}), "explorer-bob"
    )
    for explorer in explorers:
        assert all(explorer.may_read(t) and not explorer.may_write(t) for t in universe(fleet))
        assert not explorer.may_read("$SYS/broker/uptime")


def test_no_explorer_unless_asked() -> None:
    assert not [i for i in fleet_identities(seven_agent_fleet()) if i.kind is Kind.EXPLORER]


def test_an_agent_named_like_an_explorer_is_refused() -> None:
    fleet = tree_fleet({"root": None, "explorer-alice": "root"})
    fleet_identities(fleet, explorers=["bob"])
    with pytest.raises(ConfigError, match="'explorer-alice' names an agent"):
        fleet_identities(fleet, explorers=["alice"])


def test_acl_file_and_dynsec_give_each_explorer_read_only_grants() -> None:
    fleet = tree_fleet({"root": None, "worker": "root"})
    identities = fleet_identities(fleet, explorers=["alice", "bob"])
    explorers = [i for i in identities if i.kind is Kind.EXPLORER]
    acl = render_acl_file(identities)
    for explorer in explorers:
        block = f"# explorer {explorer.name}\nuser {explorer.username}\ntopic read vox/#\n"
        assert block in acl
    hashes = {i.id: hash_password("secret", iterations=1) for i in identities}
    document = json.loads(render_dynsec(identities, hashes))
    roles = {r["rolename"]: r["acls"] for r in document["roles"]}
    for explorer in explorers:
        acls = roles[f"vox-{explorer.username}"]
        assert {(a["acltype"], a["topic"], a["allow"]) for a in acls} == {
            ("subscribePattern", "vox/#", True),
            ("publishClientReceive", "vox/#", True),
        }
    clients = {c["textName"] for c in document["clients"]}
    assert {"explorer explorer-alice", "explorer explorer-bob"} <= clients


def test_in_a_federation_the_explorers_log_in_at_the_root_broker_only() -> None:
    text = federated_fleet_text(
        {"root": (None, None, ()), "far": ("root", "site", ())}, {"core": None, "site": "core"}
    )
    fleet = parse_fleet(text)
    core = broker_identities(fleet, "core", explorers=["alice", "bob"])
    site = broker_identities(fleet, "site", explorers=["alice", "bob"])
    assert [i.name for i in core if i.kind is Kind.EXPLORER] == ["explorer-alice", "explorer-bob"]
    assert not [i for i in site if i.kind is Kind.EXPLORER]


# --- from the command line -----------------------------------------------------------------


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml(seven_agent_fleet()))
    return path


def _render(fleet: Path, out: Path, *extra: str) -> int:
    return main(["broker", "render", str(fleet), "--out", str(out), "--user", "root", *extra])


def _explorers(out: Path) -> list[str]:
    return sorted(n for n in CredentialStore(out).names() if n.startswith("explorer"))


@pytest.mark.parametrize("fmt", ["acl", "dynsec"])
def test_render_explorers_are_remembered_added_and_dropped(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    out = tmp_path / "broker"
    args = ("--format", fmt, "--explorer", "alice", "--explorer", "bob")
    assert _render(fleet_file, out, *args) == 0
    said = capsys.readouterr().out
    assert "read-only explorers, one per person or tool: explorer-alice, explorer-bob" in said
    assert _explorers(out) == ["explorer-alice", "explorer-bob"]
    manifest = load_manifest(out)
    assert manifest is not None
    assert manifest.options.explorers == ("explorer-alice", "explorer-bob")
    secrets = {n: CredentialStore(out).get(n).password for n in _explorers(out)}
    security = out / ("acl" if fmt == "acl" else "dynsec.json")
    for name in _explorers(out):
        assert CredentialStore(out).get(name).username in security.read_text()
    # A re-render with no option keeps them, their secrets too.
    assert _render(fleet_file, out) == 0
    assert "changed" not in capsys.readouterr().err
    assert {n: CredentialStore(out).get(n).password for n in _explorers(out)} == secrets
    # --explorer adds one more person; the others keep their logins.
    assert _render(fleet_file, out, "--explorer", "carol") == 0
    err = capsys.readouterr().err
    assert (
        "vox: changed: explorers: ('explorer-alice', 'explorer-bob') -> "
        "('explorer-alice', 'explorer-bob', 'explorer-carol')"
    ) in err
    assert _explorers(out) == ["explorer-alice", "explorer-bob", "explorer-carol"]
    assert CredentialStore(out).get("explorer-alice").password == secrets["explorer-alice"]
    # --no-explorer with names keeps only those; alone, it drops every explorer.
    assert _render(fleet_file, out, "--no-explorer", "--explorer", "explorer-bob") == 0
    assert _explorers(out) == ["explorer-bob"]
    assert CredentialStore(out).get("explorer-bob").password == secrets["explorer-bob"]
    capsys.readouterr()
    assert _render(fleet_file, out, "--no-explorer", "--json") == 0
    assert json.loads(capsys.readouterr().out)["explorers"] == []
    assert _explorers(out) == []


def test_render_refuses_a_bad_explorer_name_in_one_line(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _render(fleet_file, tmp_path / "b", "--explorer", "a b") == 2
    err = capsys.readouterr().err
    assert "--explorer 'a b': a name is" in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_a_manifest_of_the_single_explorer_keeps_it(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--explorer") == 0
    # render.json as renders before named explorers wrote it: "explorer": true.
    path = out / "render.json"
    data = json.loads(path.read_text())
    del data["options"]["explorers"]
    data["options"]["explorer"] = True
    path.write_text(json.dumps(data))
    manifest = load_manifest(out)
    assert manifest is not None
    assert manifest.options.explorers == (EXPLORER_NAME,)
    assert _render(fleet_file, out, "--explorer", "alice") == 0
    assert _explorers(out) == ["explorer", "explorer-alice"]


def test_pki_certifies_each_named_explorer(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    fleet = load_fleet(fleet_file)
    assert main(["pki", "init", str(pki), str(fleet_file), "--explorer", "alice"]) == 0
    layout = PkiLayout(pki)
    assert layout.client_cert(explorer_id(fleet, "explorer-alice")).is_file()
    assert not layout.client_cert(explorer_id(fleet, "explorer-bob")).exists()
    out = tmp_path / "broker"
    # A render asking for an explorer the PKI lacks says how to certify it.
    assert _render(fleet_file, out, "--pki", str(pki), "--explorer", "bob") == 2
    assert "--explorer bob`" in capsys.readouterr().err
    assert main(["pki", "init", str(pki), str(fleet_file), "--explorer", "bob"]) == 0
    assert (
        _render(fleet_file, out, "--pki", str(pki), "--explorer", "alice", "--explorer", "bob") == 0
    )
    creds = CredentialStore(out).get("explorer-bob")
    assert creds.cert_file == layout.client_cert(explorer_id(fleet, "explorer-bob"))


def test_agent_render_writes_a_named_explorers_config(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--explorer", "alice") == 0
    fleet = load_fleet(fleet_file)
    assert resolve_agent(fleet, "explorer-alice") == "explorer-alice"
    config = tmp_path / "etc" / "alice.toml"
    assert (
        main(
            [
                "agent",
                "render",
                str(fleet_file),
                "explorer-alice",
                "--broker-dir",
                str(out),
                "--out",
                str(config),
            ]
        )
        == 0
    )
    explorer = load_explorer_config(config)
    assert explorer.explorer.name == "explorer-alice"
    assert explorer.explorer.id == explorer_id(fleet, "explorer-alice")
    assert explorer.broker.username == str(explorer.explorer.id)
