"""`vox agent render`: a config that knows only the agent, its master and children."""

from __future__ import annotations

import getpass
import stat
import tomllib
from pathlib import Path
from uuid import uuid4

import pytest

from vox_mqtt.broker.acl import explorer_id
from vox_mqtt.broker.pki import init_pki
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.cli import main
from vox_mqtt.cli.looks import load_reader
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.fleet.config import load_console_config, load_daemon_config
from vox_mqtt.fleet.explorer import load_explorer_config
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

NAMES = ("root", "coord", "spec_a", "spec_b", "other", "other_spec")
SHAPE = {
    "root": None,
    "coord": "root",
    "spec_a": "coord",
    "spec_b": "coord",
    "other": "root",
    "other_spec": "other",
}


def _fleet() -> Fleet:
    ids = {name: uuid4() for name in NAMES}
    parts = [f'[operator]\nname = "alice"\nid = "{uuid4()}"\n']
    for name, master in SHAPE.items():
        lines = [f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"']
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        if name == "coord":
            lines += [
                'roles = ["tests.kits.roles_for_tests:Sleeper"]',
                "heartbeat_interval = 5",
                'settings = { "odd key" = "tab\\there", nested = { list = [1, 2.5, true] }, '
                "when = 2024-05-01T10:00:00Z, quote = 'say \"hi\"' }",
            ]
        parts.append("\n".join(lines) + "\n")
    return parse_fleet("\n".join(parts))


@pytest.fixture
def fleet() -> Fleet:
    return _fleet()


@pytest.fixture
def broker(tmp_path: Path, fleet: Fleet) -> BrokerDir:
    return render_broker_dir(
        fleet, tmp_path / "broker", host="broker.example", port=1884, run_as_user=getpass.getuser()
    )


def test_agent_config_names_only_itself_its_master_and_children(
    tmp_path: Path, fleet: Fleet, broker: BrokerDir
) -> None:
    out = tmp_path / "etc" / "coord.toml"
    rendered = render_agent_config(fleet, "coord", broker.root, out, "/var/lib/vox/coord")
    text = out.read_text()
    coord = fleet.agent("coord")
    known = {coord.id, fleet.agent("root").id, fleet.agent("spec_a").id, fleet.agent("spec_b").id}
    for agent in fleet:
        assert (str(agent.id) in text) == (agent.id in known), agent.name
        assert (f'"{agent.name}"' in text) == (agent.id in known), agent.name
    assert str(fleet.operator_id) not in text

    daemon = load_daemon_config(out)
    assert daemon.agent.id == coord.id
    assert daemon.agent.master_id == fleet.agent("root").id
    assert daemon.agent.master_name == "root"
    assert daemon.agent.children == {
        fleet.agent("spec_a").id: "spec_a",
        fleet.agent("spec_b").id: "spec_b",
    }
    assert daemon.agent.roles == ["tests.kits.roles_for_tests:Sleeper"]
    assert daemon.agent.heartbeat_interval == 5.0
    assert daemon.agent.watch_warroom is False
    assert daemon.agent.state_dir == Path("/var/lib/vox/coord")
    assert daemon.agent.settings == dict(coord.settings)
    assert daemon.broker.host == "broker.example"
    assert daemon.broker.port == 1884
    assert daemon.broker.username == str(coord.id)

    # The password comes from a 0600 copy next to the config, found relative to it.
    assert rendered.secrets == (out.parent / "coord.credentials.toml",)
    assert stat.S_IMODE(rendered.secrets[0].stat().st_mode) == 0o600
    settings = daemon.agent_config(out.parent).broker
    assert settings.password == broker.credentials_for("coord").password
    assert settings.client_id == str(coord.id)


def test_root_watches_the_war_room_and_reports_to_the_operator(
    tmp_path: Path, fleet: Fleet, broker: BrokerDir
) -> None:
    out = tmp_path / "root.toml"
    render_agent_config(fleet, "root", broker.root, out)
    daemon = load_daemon_config(out)
    assert daemon.agent.master_id == fleet.operator_id
    assert daemon.agent.master_name == "alice"
    assert daemon.agent.watch_warroom is True
    assert daemon.agent.state_dir == Path("/var/lib/vox/root")


def test_operator_console_config(tmp_path: Path, fleet: Fleet, broker: BrokerDir) -> None:
    out = tmp_path / "console" / "operator.toml"
    assert main(["agent", "render", "x", "operator", "--broker-dir", "y", "--out", "z"]) == 2
    fleet_file = _write(tmp_path, fleet)
    args = ["agent", "render", fleet_file, "operator", "--broker-dir", str(broker.root)]
    code = main([*args, "--out", str(out)])
    assert code == 0
    console = load_console_config(out)
    assert console.operator.id == fleet.operator_id
    assert console.operator.name == "alice"
    assert console.operator.root_id == fleet.root.id
    assert console.operator.root_name == "root"
    assert console.operator.state_dir == Path("alice-state")
    password = console.broker.settings(str(fleet.operator_id), base=out.parent).password
    assert password == broker.credentials_for("alice").password


@pytest.mark.parametrize("locked", [True, False])
def test_a_second_operator_console_is_refused_where_client_ids_are_locked(
    tmp_path: Path, fleet: Fleet, locked: bool
) -> None:
    """With client ids locked to usernames, a second console of the operator's identity
    would be given the operator's own client id and take its session over (found by
    tests/integration/test_broker_outage.py); it is refused, the operator's own is not."""
    broker = render_broker_dir(
        fleet, tmp_path / "b", port=1884, run_as_user=getpass.getuser(), lock_client_ids=locked
    )
    out = tmp_path / "console" / "operator.toml"
    render_agent_config(fleet, "operator", broker.root, out)
    console = load_console_config(out)
    own = console.agent_config(out.parent)
    assert own.broker.client_id == str(fleet.operator_id)
    if locked:
        with pytest.raises(ConfigError, match="take over the operator's own session"):
            console.agent_config(out.parent, client_id=f"{fleet.operator_id}-look")
        with pytest.raises(ConfigError, match="locks client ids"):
            OperatorConsole(out, persistent=False)
    else:
        second = console.agent_config(out.parent, client_id=f"{fleet.operator_id}-look")
        assert second.broker.session_expiry == 0
        OperatorConsole(out, persistent=False)


def test_explorer_config_is_a_read_only_look(tmp_path: Path, fleet: Fleet) -> None:
    broker = render_broker_dir(
        fleet, tmp_path / "xb", port=1884, run_as_user=getpass.getuser(), explorer=True
    )
    out = tmp_path / "explorer" / "explorer.toml"
    fleet_file = _write(tmp_path, fleet)
    args = ["agent", "render", fleet_file, "explorer", "--broker-dir", str(broker.root)]
    assert main([*args, "--out", str(out)]) == 0
    explorer = load_explorer_config(out)
    assert explorer.explorer.id == explorer_id(fleet)
    assert explorer.explorer.operator_id == fleet.operator_id
    reader = load_reader(out)
    assert (reader.kind, reader.name, reader.top) == ("explorer", "explorer", fleet.operator_id)
    assert reader.broker.username == str(explorer_id(fleet))
    assert reader.broker.client_id != reader.broker.username  # a throw-away client id
    assert reader.broker.password == broker.credentials_for("explorer").password


def _write(tmp_path: Path, fleet: Fleet) -> str:
    """Write a fleet file equivalent to the fleet (ids and shape) for the CLI."""
    parts = [f'[operator]\nname = "{fleet.operator_name}"\nid = "{fleet.operator_id}"\n']
    for agent in fleet:
        master = f'master_id = "{agent.master_id}"\n' if agent.master_id else ""
        parts.append(f'[[agents]]\nname = "{agent.name}"\nid = "{agent.id}"\n{master}')
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(parts))
    return str(path)


def test_cli_renders_and_reports_what_it_wrote(
    tmp_path: Path, fleet: Fleet, broker: BrokerDir, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "spec_a.toml"
    args = ["agent", "render", _write(tmp_path, fleet), "spec_a"]
    args += ["--broker-dir", str(broker.root), "--out", str(out), "--state-dir", "/srv/a"]
    args += ["--keepalive", "12", "--shutdown-grace", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out} (agent spec_a)" in printed
    assert "spec_a.credentials.toml (secret, mode 0600)" in printed
    daemon = load_daemon_config(out)
    assert daemon.broker.keepalive == 12
    assert daemon.agent.shutdown_grace == 4.0
    assert daemon.agent.children == {}
    assert daemon.agent.state_dir == Path("/srv/a")


def test_unknown_agent_and_missing_broker_dir_are_clear_errors(
    tmp_path: Path, fleet: Fleet, broker: BrokerDir, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, fleet)
    out = str(tmp_path / "x.toml")
    assert main(["agent", "render", path, "nobody", "--broker-dir", str(broker.root), "--out", out])
    err = capsys.readouterr().err
    assert "no agent 'nobody' in the fleet" in err
    assert "coord" in err
    assert main(["agent", "render", path, "coord", "--broker-dir", str(tmp_path), "--out", out])
    err = capsys.readouterr().err
    assert "no credentials for 'coord'" in err
    assert "vox broker render" in err
    assert not Path(out).exists()


def test_tls_files_are_copied_and_referenced_relative_to_the_config(
    tmp_path: Path, fleet: Fleet
) -> None:
    init_pki(tmp_path / "pki", fleet, hosts=["broker.example"])
    broker = render_broker_dir(
        fleet,
        tmp_path / "broker",
        host="broker.example",
        pki_dir=tmp_path / "pki",
        run_as_user=getpass.getuser(),
    )
    out = tmp_path / "bundle" / "spec_b.toml"
    rendered = render_agent_config(fleet, "spec_b", broker.root, out)
    daemon = load_daemon_config(out)
    assert daemon.broker.port == 8883
    assert daemon.broker.ca_file == Path("spec_b.tls/ca.crt")
    assert daemon.broker.cert_file == Path("spec_b.tls/client.crt")
    assert daemon.broker.key_file == Path("spec_b.tls/client.key")
    assert len(rendered.secrets) == 4
    # The bundle moves as one folder: paths resolve against the config's new home.
    moved = tmp_path / "etc-vox"
    (tmp_path / "bundle").rename(moved)
    settings = load_daemon_config(moved / "spec_b.toml").agent_config(moved).broker
    assert settings.ca_file == moved / "spec_b.tls" / "ca.crt"
    assert settings.key_file is not None
    assert settings.key_file.read_bytes().startswith(b"-----BEGIN")
    assert stat.S_IMODE(settings.key_file.stat().st_mode) == 0o600
    original = broker.credentials_for("spec_b")
    assert original.cert_file is not None
    assert settings.cert_file is not None
    assert settings.cert_file.read_bytes() == original.cert_file.read_bytes()


def test_settings_of_any_toml_shape_survive_the_round_trip(
    tmp_path: Path, fleet: Fleet, broker: BrokerDir
) -> None:
    out = tmp_path / "coord.toml"
    render_agent_config(fleet, "coord", broker.root, out)
    settings = tomllib.loads(out.read_text())["agent"]["settings"]
    assert settings == dict(fleet.agent("coord").settings)
    assert settings["odd key"] == "tab\there"
    assert settings["quote"] == 'say "hi"'


def test_render_takes_an_exact_id_first_and_refuses_a_name_that_is_an_id_prefix() -> None:
    from vox_mqtt.cli.agent import resolve_agent
    from vox_mqtt.protocol.hierarchy import AgentSpec

    root, victim = uuid4(), uuid4()
    prefix = str(victim)[:8]
    # Built directly, as an older file could hold it: the fleet file now refuses such names.
    fleet = Fleet(
        uuid4(),
        "operator",
        (
            AgentSpec(name="root", id=root, master_id=None),
            AgentSpec(name="victim", id=victim, master_id=root),
            AgentSpec(name=str(victim), id=uuid4(), master_id=root),
            AgentSpec(name=prefix, id=uuid4(), master_id=root),
        ),
    )
    assert resolve_agent(fleet, str(victim)) == "victim"
    with pytest.raises(ValueError, match="both an agent's name and the start of the id of victim"):
        resolve_agent(fleet, prefix)
    assert resolve_agent(fleet, "victim") == "victim"
    assert resolve_agent(fleet, str(root)[:6]) == "root"
    assert resolve_agent(fleet, "operator") == "operator"
