"""`vox fleet diff`: every kind of change, what it refuses, and the order of its steps."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from vox_mqtt.cli import main
from vox_mqtt.fleet.diff import Action, ChangeKind, FleetDiff, Phase, diff_fleets
from vox_mqtt.fleet.plan import plan_steps
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet

OPERATOR = uuid4()
IDS = {name: uuid4() for name in ("root", "coord_a", "coord_b", "spec_1", "spec_2", "spec_3")}
# name: (master, roles)
BASE: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "root": (None, ()),
    "coord_a": ("root", ("m:Coordinator",)),
    "coord_b": ("root", ("m:Coordinator",)),
    "spec_1": ("coord_a", ("m:Analyst",)),
    "spec_2": ("coord_a", ("m:Analyst",)),
}


def fleet(
    shape: Mapping[str, tuple[str | None, Sequence[str]]] = BASE,
    *,
    ids: Mapping[str, UUID] | None = None,
    operator: str = "operator",
    operator_id: UUID = OPERATOR,
    extra: Mapping[str, str] | None = None,
) -> Fleet:
    """Return a fleet of shape {name: (master name, roles)}, ids from IDS unless given."""
    ids = {**IDS, **(ids or {})}
    parts = [f'[operator]\nname = "{operator}"\nid = "{operator_id}"\n']
    for name, (master, roles) in shape.items():
        lines = [f'name = "{name}"', f'id = "{ids[name]}"']
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        lines.append("roles = [" + ", ".join(f'"{r}"' for r in roles) + "]")
        lines += [(extra or {}).get(name, "")]
        parts.append("[[agents]]\n" + "\n".join(lines) + "\n")
    return parse_fleet("\n".join(parts))


def kinds(diff: FleetDiff) -> list[tuple[str, str]]:
    return sorted((change.kind.value, change.name) for change in diff.changes)


def actions(diff: FleetDiff) -> dict[str, tuple[Action, Phase]]:
    return {a.name: (a.action, a.phase) for a in diff.actions}


def test_an_unchanged_fleet_is_an_empty_diff() -> None:
    diff = diff_fleets(fleet(), fleet())
    assert diff.empty
    assert plan_steps(diff, fleet="f.toml") == []


def test_adding_a_specialist_starts_it_after_the_broker_and_its_master_learns_it_last() -> None:
    new = fleet({**BASE, "spec_3": ("coord_a", ("m:Analyst",))})
    diff = diff_fleets(fleet(), new)
    assert kinds(diff) == [("added", "spec_3")]
    assert diff.of_kind(ChangeKind.ADDED)[0].new_master == "coord_a"
    assert actions(diff) == {
        "spec_3": (Action.START, Phase.START),
        "coord_a": (Action.RELOAD, Phase.LEARN),
    }
    assert diff.broker.added == ("spec_3",)
    # The master's rules name the new child: it may write its inbox and read its status.
    assert diff.broker.rules_changed == ("coord_a",)
    assert "credentials/secrets.json: spec_3 (new)" in diff.broker.files
    assert diff.action_of("coord_a")[0].reasons == ("new child 'spec_3'",)


def test_retiring_a_specialist_makes_its_master_forget_it_before_the_broker_changes() -> None:
    shape = {k: v for k, v in BASE.items() if k != "spec_2"}
    diff = diff_fleets(fleet(), fleet(shape))
    assert kinds(diff) == [("retired", "spec_2")]
    assert diff.of_kind(ChangeKind.RETIRED)[0].old_master == "coord_a"
    assert actions(diff) == {
        "coord_a": (Action.RELOAD, Phase.FORGET),
        "spec_2": (Action.RETIRE, Phase.RETIRE),
    }
    assert diff.broker.removed == ("spec_2",)
    assert diff.broker.added == ()
    assert "credentials/secrets.json: spec_2 (deleted)" in diff.broker.files


def test_moving_a_specialist_orders_old_master_broker_specialist_new_master() -> None:
    new = fleet({**BASE, "spec_2": ("coord_b", ("m:Analyst",))})
    diff = diff_fleets(fleet(), new)
    assert kinds(diff) == [("moved", "spec_2")]
    moved = diff.of_kind(ChangeKind.MOVED)[0]
    assert (moved.old_master, moved.new_master) == ("coord_a", "coord_b")
    assert actions(diff) == {
        "coord_a": (Action.RELOAD, Phase.FORGET),
        "spec_2": (Action.RESTART, Phase.START),
        "coord_b": (Action.RELOAD, Phase.LEARN),
    }
    assert diff.broker.added == diff.broker.removed == ()
    assert diff.broker.rules_changed == ("coord_a", "coord_b", "spec_2")
    steps = plan_steps(diff, fleet="new.toml", broker_dir="/b")
    order = [(step.host, step.commands[-1]) for step in steps]
    assert order == [
        ("broker host", "sudo vox agent render new.toml coord_a --broker-dir /b "
         "--out bundles/coord_a/coord_a.toml"),
        ("host of coord_a", "sudo systemctl reload vox-agent@coord_a"),
        ("broker host", "sudo systemctl reload mosquitto"),
        ("broker host", "sudo vox agent render new.toml spec_2 --broker-dir /b "
         "--out bundles/spec_2/spec_2.toml"),
        ("host of spec_2", "sudo systemctl restart vox-agent@spec_2"),
        ("broker host", "sudo vox agent render new.toml coord_b --broker-dir /b "
         "--out bundles/coord_b/coord_b.toml"),
        ("host of coord_b", "sudo systemctl reload vox-agent@coord_b"),
    ]  # fmt: skip
    assert [step.number for step in steps] == list(range(1, 8))


def test_renaming_keeps_the_identity_and_moves_the_unit_and_its_state() -> None:
    shape = {("analyst_2" if k == "spec_2" else k): v for k, v in BASE.items()}
    diff = diff_fleets(fleet(), fleet(shape, ids={"analyst_2": IDS["spec_2"]}))
    assert kinds(diff) == [("renamed", "analyst_2")]
    assert diff.changes[0].old_name == "spec_2"
    assert diff.changes[0].id == IDS["spec_2"]
    restart = diff.action_of("analyst_2")[0]
    assert (restart.action, restart.old_name) == (Action.RESTART, "spec_2")
    assert actions(diff)["coord_a"] == (Action.RELOAD, Phase.LEARN)
    # Rules are by id: only the credentials file changes its name.
    assert diff.broker.rules_changed == diff.broker.added == diff.broker.removed == ()
    assert diff.broker.renamed == (("spec_2", "analyst_2"),)
    host = next(s for s in plan_steps(diff, fleet="f") if s.host == "host of analyst_2")
    assert host.commands[:2] == (
        "sudo systemctl disable --now vox-agent@spec_2",
        "sudo mv /var/lib/vox/spec_2 /var/lib/vox/analyst_2",
    )


def test_renaming_a_master_reloads_its_children_and_the_root_rename_reaches_the_console() -> None:
    shape = {("boss" if k == "root" else k): v for k, v in BASE.items()}
    shape = {k: (("boss" if m == "root" else m), r) for k, (m, r) in shape.items()}
    diff = diff_fleets(fleet(), fleet(shape, ids={"boss": IDS["root"]}))
    assert kinds(diff) == [("renamed", "boss")]
    assert actions(diff)["coord_a"] == (Action.RELOAD, Phase.LEARN)
    assert diff.action_of("coord_a")[0].reasons == ("its master is renamed 'root' -> 'boss'",)
    assert diff.console == ("the root is renamed 'root' -> 'boss'",)
    assert plan_steps(diff, fleet="f")[-1].host == "operator's machine"


def test_a_new_id_for_a_kept_name_retires_the_old_identity_and_starts_the_new() -> None:
    fresh = uuid4()
    diff = diff_fleets(fleet(), fleet(ids={"spec_2": fresh}))
    assert kinds(diff) == [("reidentified", "spec_2")]
    change = diff.changes[0]
    assert (change.old_id, change.id) == (IDS["spec_2"], fresh)
    assert [(a.action, a.phase, a.id) for a in diff.action_of("spec_2")] == [
        (Action.RETIRE, Phase.RETIRE, IDS["spec_2"]),
        (Action.START, Phase.START, fresh),
    ]
    # Its master sees one child leave and another arrive: it reloads after the broker.
    assert actions(diff)["coord_a"] == (Action.RELOAD, Phase.LEARN)
    assert diff.broker.added == diff.broker.removed == ("spec_2",)


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ({"spec_1": "heartbeat_interval = 5"}, ("heartbeat_interval",)),
        ({"spec_1": 'settings = { mailbox = "x@example.com" }'}, ("settings",)),
    ],
)
def test_a_changed_config_restarts_only_that_agent(
    extra: dict[str, str], fields: tuple[str, ...]
) -> None:
    diff = diff_fleets(fleet(), fleet(extra=extra))
    assert kinds(diff) == [("reconfigured", "spec_1")]
    assert diff.changes[0].fields == fields
    assert actions(diff) == {"spec_1": (Action.RESTART, Phase.START)}
    assert not diff.broker.changed


def test_changed_roles_restart_the_agent() -> None:
    new = fleet({**BASE, "spec_1": ("coord_a", ("m:Analyst", "m:Mailer"))})
    diff = diff_fleets(fleet(), new)
    assert diff.changes[0].fields == ("roles",)
    assert "('m:Analyst',) -> ('m:Analyst', 'm:Mailer')" in diff.changes[0].text
    assert actions(diff) == {"spec_1": (Action.RESTART, Phase.START)}


def test_renaming_the_operator_renames_its_credentials_and_reloads_the_root() -> None:
    diff = diff_fleets(fleet(), fleet(operator="alice"))
    assert kinds(diff) == [("operator-renamed", "alice")]
    assert diff.broker.renamed == (("operator", "alice"),)
    assert actions(diff) == {"root": (Action.RELOAD, Phase.LEARN)}
    assert diff.console == ("the operator is renamed 'operator' -> 'alice'",)


def test_a_moved_agent_that_also_gains_a_child_restarts_once() -> None:
    new = fleet({**BASE, "coord_b": ("coord_a", ("m:C",)), "spec_3": ("coord_b", ())})
    diff = diff_fleets(fleet(), new)
    assert kinds(diff) == [("added", "spec_3"), ("moved", "coord_b"), ("reconfigured", "coord_b")]
    assert diff.action_of("coord_b")[0].action == Action.RESTART
    assert len(diff.action_of("coord_b")) == 1


def test_it_refuses_a_new_root() -> None:
    shape = dict(BASE)
    shape["coord_a"] = (None, ())
    shape["root"] = ("coord_a", ())
    diff = diff_fleets(fleet(), fleet(shape))
    assert len(diff.refused) == 1
    assert "the root changes ('root'" in diff.refused[0]
    assert diff.changes == ()
    assert diff.actions == ()


def test_it_refuses_a_new_operator_id() -> None:
    diff = diff_fleets(fleet(), fleet(operator_id=uuid4()))
    assert diff.refused
    assert "the operator's id changes" in diff.refused[0]


def test_it_refuses_an_id_reused_with_another_name_while_the_name_stays() -> None:
    # spec_2's id goes to a new name and spec_2 takes a fresh id: state dirs and units are
    # per name, so the old ledger would serve the wrong identity.
    shape = {**BASE, "spec_3": ("coord_a", ("m:Analyst",))}
    diff = diff_fleets(fleet(), fleet(shape, ids={"spec_3": IDS["spec_2"], "spec_2": uuid4()}))
    assert len(diff.refused) == 1
    assert f"id {IDS['spec_2']} was 'spec_2' and is now 'spec_3'" in diff.refused[0]


def test_it_refuses_two_names_that_swap_ids() -> None:
    diff = diff_fleets(fleet(), fleet(ids={"spec_1": IDS["spec_2"], "spec_2": IDS["spec_1"]}))
    assert len(diff.refused) == 2
    assert all("names and ids are swapped" in reason for reason in diff.refused)


# --- the command -----------------------------------------------------------------------------


def write(tmp: Path, name: str, text: Fleet) -> Path:
    path = tmp / name
    parts = [f'[operator]\nname = "{text.operator_name}"\nid = "{text.operator_id}"\n']
    for agent in text:
        lines = [f'name = "{agent.name}"', f'id = "{agent.id}"']
        if agent.master_id is not None:
            lines.append(f'master_id = "{agent.master_id}"')
        parts.append("[[agents]]\n" + "\n".join(lines) + "\n")
    path.write_text("\n".join(parts))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_changes_agents_and_numbered_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.toml", fleet())
    new = write(tmp_path, "new.toml", fleet({**BASE, "spec_2": ("coord_b", ())}))
    code, out, err = run(capsys, "fleet", "diff", old, new)
    assert (code, err) == (0, "")
    assert "moved            'spec_2' moves from under 'coord_a' to under 'coord_b'" in out
    assert "1. [broker host]" in out
    assert "7. [host of coord_b]" in out
    assert f"$ sudo vox broker render {new} --out /etc/vox/broker" in out


def test_the_command_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.toml", fleet())
    new = write(tmp_path, "new.toml", fleet({**BASE, "spec_3": ("coord_b", ())}))
    code, out, _ = run(capsys, "fleet", "diff", old, new, "--json", "--broker-dir", "/srv/b")
    data: dict[str, Any] = json.loads(out)
    assert code == 0
    assert data["refused"] == []
    assert data["changes"] == [
        {
            "kind": "added",
            "name": "spec_3",
            "id": str(IDS["spec_3"]),
            "new_master": "coord_b",
            "text": f"'spec_3' ({IDS['spec_3']}) is added under 'coord_b'",
        }
    ]
    assert data["broker"]["identities_added"] == ["spec_3"]
    assert [(a["name"], a["action"], a["phase"]) for a in data["agents"]] == [
        ("spec_3", "start", 4),
        ("coord_b", "reload", 5),
    ]
    assert data["steps"][0]["commands"][0].endswith("--out /srv/b")


def test_the_command_says_no_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.toml", fleet())
    assert run(capsys, "fleet", "diff", old, old)[:2] == (
        0,
        "no change: the fleet runs as this file describes\nsignatures: off (unchanged)\n",
    )


def test_the_command_refuses_with_one_line_per_reason_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.toml", fleet())
    new = write(tmp_path, "new.toml", fleet(operator_id=uuid4()))
    code, out, err = run(capsys, "fleet", "diff", old, new)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"vox: error: {new}: the operator's id changes (")
    code, out, _ = run(capsys, "fleet", "diff", old, new, "--json")
    assert code == 2
    assert json.loads(out)["refused"]


def test_the_command_reports_an_invalid_fleet_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.toml", fleet())
    code, _, err = run(capsys, "fleet", "diff", old, tmp_path / "missing.toml")
    assert code == 2
    assert err == f"vox: error: {tmp_path / 'missing.toml'}: no such fleet file " + (
        f"(create one with `vox init {tmp_path / 'missing.toml'}`)\n"
    )


# --- a federated fleet ------------------------------------------------------------------------

SITES = """
[[brokers]]
name = "core"

[[brokers]]
name = "plant"
upstream = "core"
"""


def federated(brokers: dict[str, str], *, sites: str = SITES) -> Fleet:
    """Return BASE with [[brokers]]: coord_b on the plant site unless brokers says otherwise."""
    placed = {"coord_b": "plant", **brokers}
    text = f'[operator]\nname = "operator"\nid = "{OPERATOR}"\n{sites}\n'
    for name, (master, _) in BASE.items():
        lines = [f'name = "{name}"', f'id = "{IDS[name]}"']
        if master is not None:
            lines.append(f'master_id = "{IDS[master]}"')
        if name in placed:
            lines.append(f'broker = "{placed[name]}"')
        text += "[[agents]]\n" + "\n".join(lines) + "\n"
    return parse_fleet(text)


def test_a_federated_fleet_re_renders_every_broker_upstream_first() -> None:
    old = federated({})
    new = federated({"coord_b": "core"})
    diff = diff_fleets(old, new)
    assert kinds(diff) == [("reconfigured", "coord_b")]
    assert diff.changes[0].fields == ("broker",)
    assert actions(diff) == {"coord_b": (Action.RESTART, Phase.START)}
    assert diff.brokers == ("core", "plant")
    hosts = [s.host for s in plan_steps(diff, fleet="f.toml") if s.phase == Phase.BROKER]
    assert hosts == ["broker host of core", "broker host of plant"]


def test_a_new_site_is_a_change_of_the_fleets_brokers() -> None:
    sites = SITES + '\n[[brokers]]\nname = "line"\nupstream = "plant"\n'
    diff = diff_fleets(federated({}), federated({}, sites=sites))
    assert kinds(diff) == [("brokers", "brokers")]
    assert "+line" in diff.changes[0].text
    assert diff.brokers == ("core", "plant", "line")


def test_the_command_says_a_change_of_the_replay_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.toml", fleet())
    new = tmp_path / "new.toml"
    new.write_text('signatures = "require"\nreplay_window = 120\n' + old.read_text())
    code, out, _ = run(capsys, "fleet", "diff", old, new)
    assert code == 0
    assert "signatures: off -> require" in out
    assert "reconnects once, cleanly, so that its will is signed" in out
    assert "replay window: 600 s -> 120 s: `vox agent render` every bundle" in out
    code, out, _ = run(capsys, "fleet", "diff", old, new, "--json")
    assert json.loads(out)["replay_window"] == {"old": 600.0, "new": 120.0}
