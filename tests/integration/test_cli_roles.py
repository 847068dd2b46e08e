"""`vox tree`, `agent render` and `init --add` check role paths where the fleet is edited."""

from __future__ import annotations

import getpass
import subprocess
import sys
import tomllib
from pathlib import Path
from uuid import UUID

import pytest

from tests.kits.fleetproc import REPO, child_env
from vox_mqtt.agent.rolecheck import check_role
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.cli import main
from vox_mqtt.protocol.hierarchy import load_fleet


def seeded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "fleet.toml"
    assert main(["init", str(path)]) == 0
    capsys.readouterr()
    return path


def test_check_role_verdicts() -> None:
    assert check_role("examples.freelance:Analyst").verdict == "ok"
    typo = check_role("examples.freelance:Analsyt")
    assert (typo.verdict, typo.reason) == (
        "bad",
        "examples.freelance has no Analsyt — did you mean 'Analyst'?",
    )
    module = check_role("examples.freelanse:Analyst")
    assert module.verdict == "bad"
    assert "did you mean 'freelance'?" in module.reason
    not_a_role = check_role("examples.freelance:BaseModel")
    assert (not_a_role.verdict, "not a vox_mqtt Role" in not_a_role.reason) == ("bad", True)
    elsewhere = check_role("acme_site_roles.gpu:Trainer")
    assert elsewhere.verdict == "unchecked"
    assert "no module 'acme_site_roles' on this machine" in elsewhere.reason
    assert check_role("nocolon").verdict == "bad"


def test_tree_names_the_bad_role_with_its_line_and_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = seeded(tmp_path, capsys)
    assert main(["tree", str(path)]) == 0
    assert capsys.readouterr().err == ""
    text = path.read_text()
    path.write_text(
        text.replace('"examples.freelance:Analyst"]', '"examples.freelance:Analsyt"]').replace(
            '"examples.freelance:Coordinator"]', '"acme_site_roles.gpu:Trainer"]'
        )
    )
    line = next(
        n
        for n, row in enumerate(path.read_text().splitlines(), 1)
        if row == 'name = "specialist_b"'
    )
    assert main(["tree", str(path)]) == 2
    captured = capsys.readouterr()
    assert "specialist_b (id:" in captured.out  # the tree is still drawn
    err = captured.err.splitlines()
    assert err == [
        f"vox: error: {path}:{line - 1}: agent specialist_b: role 'examples.freelance:Analsyt': "
        "examples.freelance has no Analsyt — did you mean 'Analyst'?",
        "vox: warning: role 'acme_site_roles.gpu:Trainer' not checked: no module "
        "'acme_site_roles' on this machine (`vox-agent --check` checks it on the agent's host)",
    ]


def test_agent_render_refuses_a_bad_role_and_takes_an_id_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = seeded(tmp_path, capsys)
    fleet = load_fleet(path)
    broker = render_broker_dir(fleet, tmp_path / "broker", port=1884, run_as_user=getpass.getuser())
    spec_b = fleet.agent("specialist_b")
    out = tmp_path / "etc" / "b.toml"
    args = ["agent", "render", str(path), "--broker-dir", str(broker.root), "--out", str(out)]
    assert main([*args[:3], str(spec_b.id)[:8], *args[3:]]) == 0
    assert tomllib.loads(out.read_text())["agent"]["name"] == "specialist_b"
    out.unlink()
    path.write_text(path.read_text().replace('"examples.freelance:Analyst"]', '"examples.x:Y"]'))
    assert main([*args[:3], "specialist_b", *args[3:]]) == 2
    err = capsys.readouterr().err
    assert "role 'examples.x:Y': examples has no module 'x'" in err
    assert "not written" in err
    assert not out.exists()
    # A prefix that starts two ids is refused, naming both.
    twin = str(spec_b.id)[:8] + "-0000-4000-8000-000000000000"
    path.write_text(path.read_text().replace(str(fleet.agent("specialist_a").id), twin))
    assert main([*args[:3], str(spec_b.id)[:8], *args[3:]]) == 2
    err = capsys.readouterr().err
    assert f"agent id '{str(spec_b.id)[:8]}' is ambiguous in the fleet" in err
    assert twin in err
    assert main([*args[:3], "zzz", *args[3:]]) == 2
    assert "no agent 'zzz' in the fleet" in capsys.readouterr().err


def test_init_add_appends_an_agent_with_a_fresh_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = seeded(tmp_path, capsys)
    before = path.read_text()
    code = main(
        ["init", str(path), "--add", "specialist_c", "--master", "coordinator", "--role",
         "examples.freelance:Analyst"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("added specialist_c (id: ")
    assert path.read_text().startswith(before)  # comments and order kept
    fleet = load_fleet(path)
    added = fleet.agent("specialist_c")
    assert added.master_id == fleet.agent("coordinator").id
    assert added.roles == ("examples.freelance:Analyst",)
    assert str(added.id) in out
    # Refusals leave the file alone: a taken name, an unknown master, a bad role.
    for extra, message in (
        (["--add", "specialist_c", "--master", "root"], "specialist_c"),
        (["--add", "d", "--master", "nobody"], "--master 'nobody': no such agent"),
        (["--add", "d", "--master", "root", "--role", "examples.freelance:Rot"], "'Root'?"),
        (["--add", "d"], "needs --master"),
    ):
        snapshot = path.read_text()
        assert main(["init", str(path), *extra]) == 2, extra
        assert message in capsys.readouterr().err
        assert path.read_text() == snapshot


def test_vox_uuid_prints_fresh_ids() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", "uuid", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    ids = [UUID(line) for line in done.stdout.splitlines()]
    assert len(set(ids)) == 3
    assert all(u.version == 4 for u in ids)
