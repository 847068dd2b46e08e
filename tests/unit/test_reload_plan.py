"""What a changed daemon config means to a running agent (agent_daemon.reload.plan_reload)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from agent_daemon.reload import plan_reload
from vox_mqtt.fleet.config import DaemonFile

MASTER, CHILD_A, CHILD_B = uuid4(), uuid4(), uuid4()
ME = str(uuid4())


def daemon_file(**agent: Any) -> DaemonFile:
    section: dict[str, Any] = {
        "name": "coordinator",
        "id": str(uuid4()) if "id" not in agent else agent.pop("id"),
        "master_id": str(MASTER),
        "master_name": "root",
        "children": {str(CHILD_A): "spec_a"},
        "state_dir": "/var/lib/vox/coordinator",
    }
    section.update(agent)
    return DaemonFile.model_validate(
        {"agent": section, "broker": {"username": section["id"], "password": "x"}}
    )


def test_the_same_file_is_unchanged() -> None:
    plan = plan_reload(daemon_file(id=ME), daemon_file(id=ME))
    assert plan.unchanged
    assert not plan.live


def test_children_and_names_apply_live() -> None:
    old = daemon_file(id=ME)
    new = daemon_file(
        id=ME, children={str(CHILD_A): "analyst", str(CHILD_B): "spec_b"}, master_name="boss"
    )
    plan = plan_reload(old, new)
    assert plan.live
    assert plan.restart_keys == ()
    assert dict(plan.added) == {CHILD_B: "spec_b"}
    assert dict(plan.renamed) == {CHILD_A: ("spec_a", "analyst")}
    assert plan.summary() == "children +spec_b spec_a->analyst; master renamed 'boss'"
    gone = plan_reload(old, daemon_file(id=ME, children={}))
    assert dict(gone.removed) == {CHILD_A: "spec_a"}
    assert gone.summary() == "children -spec_a"


def test_identity_master_and_config_take_a_restart() -> None:
    old = daemon_file(id=ME)
    assert plan_reload(old, daemon_file()).restart_keys == ("agent.id", "broker.username")
    assert plan_reload(old, daemon_file(id=ME, master_id=str(uuid4()))).restart_keys == (
        "agent.master_id",
    )
    mixed = plan_reload(old, daemon_file(id=ME, children={}, heartbeat_interval=5.0))
    assert mixed.restart_keys == ("agent.heartbeat_interval",)
    assert not mixed.live  # one restart-only key refuses the whole change


def test_a_new_secret_applies_from_the_next_connection() -> None:
    old = daemon_file(id=ME)
    secret = plan_reload(old, old, old_secret="a", new_secret="b")
    assert secret.live
    assert secret.restart_keys == ()
    assert secret.summary() == "a new broker secret, used from the next connection on"
    moved = daemon_file(id=ME)
    moved = moved.model_copy(update={"broker": moved.broker.model_copy(update={"port": 8883})})
    assert plan_reload(old, moved, old_secret="a", new_secret="b").restart_keys == ("broker.port",)
