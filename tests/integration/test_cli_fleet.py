"""`vox init` and `vox tree`, run as the installed console script an operator runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from vox_mqtt.protocol.hierarchy import load_fleet

VOX_SCRIPT = Path(sys.executable).with_name("vox")
VOX = [str(VOX_SCRIPT)] if VOX_SCRIPT.exists() else [sys.executable, "-m", "vox_mqtt.cli"]


def vox(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VOX, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def fleet_names() -> list[str]:
    return ["root", "coordinator", "specialist_a", "specialist_b"]


def test_init_writes_the_seed_tree_with_fresh_uuids(tmp_path: Path) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    done = vox("init", first)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert vox("init", second).returncode == 0
    fleets = [load_fleet(first), load_fleet(second)]
    identities = [{fleet.operator_id, *(agent.id for agent in fleet)} for fleet in fleets]
    assert [len(ids) for ids in identities] == [5, 5]
    assert not identities[0] & identities[1]
    for fleet in fleets:
        assert [agent.name for agent in fleet] == fleet_names()
        assert fleet.master_of(fleet.agent("specialist_b").id) == fleet.agent("coordinator").id
    assert done.stdout.startswith(f"wrote {first}: the operator and 4 agents")
    assert f"root (id: {fleets[0].root.id})" in done.stdout


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("# the operator's own fleet\n")
    done = vox("init", path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"vox: error: {path} already exists; not overwriting it (remove it or pick another path)\n"
    )
    assert path.read_text() == "# the operator's own fleet\n"


def test_init_into_a_missing_directory_says_so(tmp_path: Path) -> None:
    done = vox("init", tmp_path / "nowhere" / "fleet.toml")
    assert done.returncode == 2
    assert done.stderr.startswith("vox: error: cannot create ")
    assert "No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_tree_draws_the_seed_picture(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    assert vox("init", path).returncode == 0
    fleet = load_fleet(path)
    root, coordinator, a, b = (fleet.agent(name).id for name in fleet_names())
    done = vox("tree", path)
    assert done.returncode == 0, done.stderr
    # Seed 000's "Example Hierarchy", with the placeholders filled in.
    assert done.stdout == (
        f"root (id: {root})\n"
        f'  master_id: ""\n'
        f"  └── coordinator (id: {coordinator})\n"
        f"        master_id: {root}\n"
        f"        ├── specialist_a (id: {a})\n"
        f"        │     master_id: {coordinator}\n"
        f"        └── specialist_b (id: {b})\n"
        f"              master_id: {coordinator}\n"
        "signatures: require (docs/security.md)\n"  # what `vox init` writes
    )


def test_tree_json_is_for_scripts(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    assert vox("init", path).returncode == 0
    fleet = load_fleet(path)
    done = vox("tree", "--json", path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["operator"] == {"name": "operator", "id": str(fleet.operator_id)}
    assert data["signatures"] == "require"
    root = data["root"]
    assert (root["name"], UUID(root["id"]), root["master_id"]) == ("root", fleet.root.id, "")
    (coordinator,) = root["children"]
    assert coordinator["master_id"] == root["id"]
    assert coordinator["roles"] == ["examples.freelance:Coordinator"]
    assert [child["name"] for child in coordinator["children"]] == fleet_names()[2:]
    assert all(child["children"] == [] for child in coordinator["children"])


def test_an_invalid_fleet_gives_one_line_per_problem_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    root, stranger = uuid4(), uuid4()
    path.write_text(
        f'[operator]\nid = "{uuid4()}"\n\n'
        f'[[agents]]\nname = "root"\nid = "{root}"\n\n'
        f'[[agents]]\nname = "coordinator"\nid = "not-a-uuid"\nmaster_id = "{root}"\n\n'
        f'[[agents]]\nname = "specialist_a"\nid = "{uuid4()}"\nmaster_id = "{stranger}"\n'
    )
    done = vox("tree", path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"vox: error: {path}:8: agent 'coordinator': id 'not-a-uuid' is not a UUID",
        f"vox: error: {path}:13: agent 'specialist_a': master_id {stranger} is not a known agent",
    ]


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_invalid_toml_is_one_line_without_a_traceback(tmp_path: Path, flag: list[str]) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[operator]\nid = "unterminated\n')
    done = vox("tree", *flag, path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"vox: error: {path}: not valid TOML: ")
    assert "Traceback" not in done.stderr


def test_a_missing_fleet_file_says_how_to_make_one(tmp_path: Path) -> None:
    done = vox("tree", "fleet.toml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "vox: error: fleet.toml: no such fleet file (create one with `vox init fleet.toml`)\n"
    )


def test_usage_errors_exit_2_with_argparse_help() -> None:
    done = vox("tree")
    assert done.returncode == 2
    assert "usage: vox tree" in done.stderr
    assert "Traceback" not in done.stderr
