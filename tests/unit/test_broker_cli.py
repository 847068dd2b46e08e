"""`vox broker render` and `vox pki init` from the command line: files, modes, errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.kits.brokerkit import fleet_toml, seven_agent_fleet, tree_fleet
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.passwd import Credentials, render_credentials
from vox_mqtt.cli import main
from vox_mqtt.protocol.hierarchy import load_fleet
from vox_mqtt.protocol.messages import MAX_MESSAGE_BYTES, MAX_PACKET_BYTES


def _creds(out: Path) -> dict[str, Credentials]:
    store = CredentialStore(out)
    return {name: store.get(name) for name in store.names()}


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml(seven_agent_fleet()))
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _render(fleet: Path, out: Path, *extra: str) -> int:
    return main(["broker", "render", str(fleet), "--out", str(out), "--user", "root", *extra])


def test_render_writes_the_broker_dir(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--port", "18830", "--explorer") == 0
    assert "wrote" in capsys.readouterr().out
    assert [p.name for p in (out / "credentials").iterdir()] == ["secrets.json"]
    assert sorted(_creds(out)) == sorted(
        [
            n
            for n in (
                "_canary",
                "_exporter",
                "_status",
                "_watch",
                "operator",
                "explorer",
                "root",
                "coord_a",
                "coord_b",
                "spec_a1",
                "spec_a2",
                "spec_b1",
                "spec_b2",
            )
        ]
    )
    # The secrets are the renderer's alone: the broker reads only passwd and the ACL.
    assert _mode(out / "credentials") == 0o700
    assert _mode(out / "credentials" / "secrets.json") == 0o600
    # As root, root keeps the broker's files and the broker's group may read them.
    for broker_file in (out / "passwd", out / "acl"):
        assert _mode(broker_file) == (0o640 if os.geteuid() == 0 else 0o600), broker_file
    root = _creds(out)["root"]
    assert root.username == str(load_fleet(fleet_file).agent("root").id)
    assert root.port == 18830
    assert len(root.password) >= 40
    conf = (out / "mosquitto.conf").read_text()
    for line in (
        "allow_anonymous false",
        "set_tcp_nodelay true",
        "persistence true",
        f"persistence_location {out}/data/",
        f"password_file {out}/passwd",
        f"acl_file {out}/acl",
        # Room for every retained message of the fleet's 7 agents (docs/broker.md).
        f"max_queued_messages {1000 + 4 * len(load_fleet(fleet_file).agents)}",
        f"max_packet_size {MAX_PACKET_BYTES}",
        "listener 18830 127.0.0.1",
        "user root",
    ):
        assert f"\n{line}\n" in conf, line
    assert MAX_MESSAGE_BYTES < MAX_PACKET_BYTES < MAX_MESSAGE_BYTES + 64 * 1024


def test_rerender_keeps_secrets_and_files_rotate_replaces_them(
    fleet_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out) == 0
    before = {p.name: p.read_bytes() for p in [out / "passwd", out / "acl"]}
    secrets = {name: c.password for name, c in _creds(out).items()}
    assert _render(fleet_file, out) == 0
    assert {p.name: p.read_bytes() for p in [out / "passwd", out / "acl"]} == before
    assert {name: c.password for name, c in _creds(out).items()} == secrets
    assert _render(fleet_file, out, "--rotate") == 0
    rotated = {name: c.password for name, c in _creds(out).items()}
    assert all(rotated[name] != secret for name, secret in secrets.items())


def test_agents_that_leave_lose_their_credentials(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--explorer") == 0
    smaller = tree_fleet({"root": None})
    fleet_file.write_text(fleet_toml(smaller))
    assert _render(fleet_file, out) == 0
    assert sorted(_creds(out)) == [
        "_canary",
        "_exporter",
        "_status",
        "_watch",
        "explorer",
        "operator",
        "root",
    ]


def test_dynsec_format_and_json_output(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--format", "dynsec", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "dynsec"
    assert report["passwd"] is None
    assert Path(report["security"]) == out / "dynsec.json"
    conf = (out / "mosquitto.conf").read_text()
    plugin = next(ln for ln in conf.splitlines() if ln.startswith("plugin "))
    assert Path(plugin.split(" ", 1)[1]).is_file()
    assert f"plugin_opt_config_file {out}/dynsec.json" in conf
    assert "acl_file" not in conf
    assert _mode(out / "dynsec.json") == (0o640 if os.geteuid() == 0 else 0o600)


def test_a_bad_fleet_file_gives_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[operator]\nid = "not-a-uuid"\n\n[[agents]]\nname = "root"\nid = "also-bad"\n')
    assert _render(bad, tmp_path / "out") == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("vox: error: ") for line in lines)
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert _render(tmp_path / "missing.toml", tmp_path / "out") == 2
    assert "no such fleet file" in capsys.readouterr().err


def test_an_unwritable_out_dir_is_a_clear_error(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _render(fleet_file, blocker / "broker") == 2
    err = capsys.readouterr().err
    assert f"--out {blocker / 'broker'}: cannot write there" in err
    assert "Traceback" not in err
    assert _render(fleet_file, Path("/proc/vox-broker")) == 2
    assert "cannot write there" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "0"], "--port must be"),
        (["--host", "two words"], "--host"),
        (["--pki", "/nonexistent/pki"], "run `vox pki init /nonexistent/pki FLEET`"),
        (["--user", "bad\nuser"], "--user"),
    ],
)
def test_bad_options_are_clear_errors(
    fleet_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    assert main(["broker", "render", str(fleet_file), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_an_operator_named_like_an_agent_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml(tree_fleet({"root": None, "operator": "root"})))
    assert _render(path, tmp_path / "out") == 2
    assert "'operator' names an agent" in capsys.readouterr().err


def test_pki_init_then_render_with_tls(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    assert main(["pki", "init", str(pki), str(fleet_file), "--host", "10.0.0.7"]) == 0
    assert "created" in capsys.readouterr().out
    assert main(["pki", "init", str(pki), str(fleet_file)]) == 0
    assert ": 0 files created" in capsys.readouterr().out
    out = tmp_path / "broker"
    assert (
        _render(fleet_file, out, "--pki", str(pki), "--host", "10.0.0.7", "--tls-port", "18883")
        == 0
    )
    creds = _creds(out)["spec_a1"]
    assert creds.tls
    assert creds.port == 18883
    assert creds.host == "10.0.0.7"
    assert creds.ca_file == pki / "ca.crt"
    assert creds.cert_file is not None
    assert creds.cert_file.name == f"{creds.username}.crt"
    conf = (out / "mosquitto.conf").read_text()
    assert "listener 18883 10.0.0.7\n" in conf
    assert "listener 1883 127.0.0.1\n" in conf
    assert _mode(out / "tls" / "server.key") == (0o640 if os.geteuid() == 0 else 0o600)
    assert _render(fleet_file, out, "--pki", str(pki), "--explorer") == 2
    assert "vox pki init" in capsys.readouterr().err


def test_reload_needs_a_pid(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _render(fleet_file, tmp_path / "b") == 0
    capsys.readouterr()
    assert main(["broker", "reload", str(tmp_path / "b")]) == 2
    assert "--pid or --pid-file is needed" in capsys.readouterr().err


def test_switching_format_removes_the_other_formats_files(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out) == 0
    secret = _creds(out)["root"].password
    assert _render(fleet_file, out, "--format", "dynsec") == 0
    assert not (out / "acl").exists()
    assert not (out / "passwd").exists()
    assert _render(fleet_file, out, "--format", "acl") == 0
    assert not (out / "dynsec.json").exists()
    assert _creds(out)["root"].password == secret


def test_render_remembers_its_options_and_says_what_changed(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--port", "18830", "--explorer") == 0
    names = ("mosquitto.conf", "acl", "passwd", "render.json")
    first = {n: (out / n).read_bytes() for n in names}
    store = (out / "credentials" / "secrets.json").stat()
    capsys.readouterr()
    # No options: the same listener, the explorer kept, every file byte for byte.
    assert _render(fleet_file, out) == 0
    assert "changed" not in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in names} == first
    kept = (out / "credentials" / "secrets.json").stat()
    assert (kept.st_ino, kept.st_mtime_ns) == (store.st_ino, store.st_mtime_ns)
    assert _creds(out)["root"].port == 18830
    # Moving the listener or dropping an identity happens only when asked, and is said.
    assert _render(fleet_file, out, "--port", "18831", "--no-explorer") == 0
    err = capsys.readouterr().err
    assert "vox: changed: port: 18830 -> 18831" in err
    assert "vox: changed: explorers: ('explorer',) -> ()" in err
    assert "explorer" not in _creds(out)


def test_rotate_names_rekeys_only_those_identities(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out) == 0
    before = {name: c.password for name, c in _creds(out).items()}
    passwd = (out / "passwd").read_text().splitlines()
    assert _render(fleet_file, out, "--rotate", "spec_a1") == 0
    after = {name: c.password for name, c in _creds(out).items()}
    assert [n for n in before if before[n] != after[n]] == ["spec_a1"]
    changed = set((out / "passwd").read_text().splitlines()) - set(passwd)
    spec = _creds(out)["spec_a1"].username
    assert [line.split(":")[0] for line in changed] == [spec]


def test_rotate_an_unknown_name_is_a_clear_error(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _render(fleet_file, tmp_path / "b", "--rotate", "nobody") == 2
    assert capsys.readouterr().err == (
        "vox: error: --rotate nobody: no identity of that name in the fleet\n"
    )


def test_a_dir_with_per_identity_files_is_read_then_migrated(
    fleet_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--explorer") == 0
    old = _creds(out)
    # What a render of an earlier version left: one credentials file per identity.
    store = out / "credentials" / "secrets.json"
    store.unlink()
    for name, creds in old.items():
        (out / "credentials" / f"{name}.toml").write_text(render_credentials(creds))
    assert _creds(out) == old
    assert CredentialStore(out).get(old["spec_a1"].username) == old["spec_a1"]
    passwd = (out / "passwd").read_bytes()
    assert _render(fleet_file, out) == 0
    # Migrated: the same secrets (passwd unchanged), in the store only.
    assert [p.name for p in (out / "credentials").iterdir()] == ["secrets.json"]
    assert _creds(out) == old
    assert (out / "passwd").read_bytes() == passwd


def test_a_tls_broker_is_rendered_for_dynsec_unless_acl_is_asked_for(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/broker.md, SIGHUP and TLS: a TLS broker takes its changes live, never by SIGHUP."""
    pki = tmp_path / "pki"
    assert main(["pki", "init", str(pki), str(fleet_file)]) == 0
    out = tmp_path / "broker"
    assert _render(fleet_file, out, "--pki", str(pki)) == 0
    assert (out / "dynsec.json").exists()
    assert "dynsec" in capsys.readouterr().out
    acl = tmp_path / "acl-broker"
    assert _render(fleet_file, acl, "--pki", str(pki), "--format", "acl") == 0
    assert "acl format with TLS: `vox broker reload` will not SIGHUP" in capsys.readouterr().err
    assert _render(fleet_file, acl) == 0  # remembered: stays acl, and says so again
    assert "acl format with TLS" in capsys.readouterr().err
    assert (acl / "acl").exists()
