"""`vox fleet retire` on a real, secured broker: what a retired agent left is cleared by the
identities allowed to, its watchers hear RETIRED, and after the broker is re-rendered
without it its credential is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.kits.brokerkit import (
    NO_MATCHING_SUBSCRIBERS,
    NOT_AUTHORIZED,
    SUCCESS,
    Client,
    SecureBroker,
    reload_broker,
    rerender,
    tree_fleet,
    try_connect,
)
from vox_mqtt.cli import main
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.observe.status import RETIRED
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize

ACCEPTED = (SUCCESS, NO_MATCHING_SUBSCRIBERS)
SHAPE: dict[str, str | None] = {
    "root": None,
    "coord": "root",
    "spec_a": "coord",
    "spec_b": "coord",
}


def without(fleet: Fleet, name: str) -> Fleet:
    """Return the same fleet (same ids) without one agent."""
    parts = [f'[operator]\nname = "{fleet.operator_name}"\nid = "{fleet.operator_id}"\n']
    for agent in fleet:
        if agent.name == name:
            continue
        master = "" if agent.master_id is None else f'master_id = "{agent.master_id}"\n'
        parts.append(f'[[agents]]\nname = "{agent.name}"\nid = "{agent.id}"\n{master}')
    return parse_fleet("\n".join(parts))


def write_fleet(fleet: Fleet, path: Path) -> Path:
    parts = [f'[operator]\nname = "{fleet.operator_name}"\nid = "{fleet.operator_id}"\n']
    for agent in fleet:
        master = "" if agent.master_id is None else f'master_id = "{agent.master_id}"\n'
        parts.append(f'[[agents]]\nname = "{agent.name}"\nid = "{agent.id}"\n{master}')
    path.write_text("\n".join(parts))
    return path


def status_payload(fleet: Fleet, name: str, status: str, code: str | None, epoch: int) -> bytes:
    agent = fleet.agent(name)
    report = AgentStatus(
        name=name,
        status=status,  # type: ignore[arg-type]
        error_code=code,
        epoch=epoch,
        started_at="2026-01-01T00:00:00.000000Z",
        heartbeat_interval=1.0,
    )
    return serialize(
        new_message(
            MSG_AGENT_STATUS, source=agent.id, target=fleet.master_of(agent.id), details=report
        )
    )


def post(source: UUID, subject: UUID, code: str) -> bytes:
    failure = SystemFailure(
        error_code=code, severity="CRITICAL", description=f"{code} test", subject=subject
    )
    return serialize(
        new_message(MSG_SYSTEM_FAILURE, source=source, target=topics.WARROOM_ID, details=failure)
    )


@pytest.fixture
def fleet_broker(secure_broker_factory: Callable[..., Any]) -> SecureBroker:
    secure: SecureBroker = secure_broker_factory(tree_fleet(SHAPE))
    return secure


def leave_behind(secure: SecureBroker, *, coord_active: bool) -> None:
    """Leave what a stopped spec_b and its master leave: statuses and war-room posts."""
    fleet = secure.fleet
    spec_b, coord = fleet.agent("spec_b").id, fleet.agent("coord").id
    as_spec = Client(secure.creds("spec_b"))
    as_spec.connect()
    payload = status_payload(fleet, "spec_b", "INACTIVE", "SHUTDOWN", 4)
    assert as_spec.publish(topics.status(spec_b), payload, retain=True) in ACCEPTED
    assert (
        as_spec.publish(
            topics.warroom(spec_b, spec_b), post(spec_b, spec_b, "DISK_FULL"), retain=True
        )
        in ACCEPTED
    )
    as_spec.close()
    as_coord = Client(secure.creds("coord"), client_id=f"{coord}-test")
    as_coord.connect()
    if coord_active:
        payload = status_payload(fleet, "coord", "ACTIVE", None, 1)
        assert as_coord.publish(topics.status(coord), payload, retain=True) in ACCEPTED
    assert (
        as_coord.publish(
            topics.warroom(coord, spec_b), post(coord, spec_b, "HEARTBEAT_STALE"), retain=True
        )
        in ACCEPTED
    )
    as_coord.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def retire(
    capsys: pytest.CaptureFixture[str], secure: SecureBroker, name: str, fleet: Path, *more: str
) -> tuple[int, str, str]:
    """Run `vox fleet retire NAME --fleet FLEET` against this broker directory."""
    return run(
        capsys, "fleet", "retire", name, "--fleet", fleet, "--broker-dir", secure.dir.root, *more
    )


def watch_status(secure: SecureBroker, watcher: str, subject: UUID) -> Client:
    """Log in as watcher, subscribe to subject's status, and wait for the retained one."""
    client = Client(secure.creds(watcher), client_id=f"{secure.fleet.agent(watcher).id}-watch")
    client.connect()
    client.subscribe([topics.status(subject)])
    assert client.wait_for(lambda got: any(m.retain and m.payload for m in got))
    return client


def operator_config(secure: SecureBroker, tmp_path: Path) -> Path:
    return render_agent_config(
        secure.fleet, "operator", secure.dir.root, tmp_path / "op" / "operator.toml"
    ).config


def test_retire_clears_status_and_posts_tells_the_master_and_the_credential_goes(
    fleet_broker: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = fleet_broker
    fleet = secure.fleet
    spec_b = fleet.agent("spec_b").id
    leave_behind(secure, coord_active=False)
    master = watch_status(secure, "coord", spec_b)  # as a running coordinator watches it
    new_fleet = write_fleet(without(fleet, "spec_b"), tmp_path / "new.toml")

    code, out, err = retire(capsys, secure, "spec_b", new_fleet)
    assert (code, err) == (0, ""), out
    assert f"spec_b ({spec_b}): last status INACTIVE SHUTDOWN, epoch 4" in out
    coord = fleet.agent("coord").id
    for topic in (
        topics.status(spec_b),
        topics.warroom(spec_b, spec_b),
        topics.warroom(coord, spec_b),
    ):
        assert f"cleared {topic}\n" in out
    # The master heard RETIRED live (not retained), then the clear.
    assert master.wait_for(lambda got: any(not m.retain and m.payload for m in got))
    told = [json.loads(m.payload) for m in master.messages if m.payload and not m.retain]
    assert told[0]["details"]["error_code"] == RETIRED
    assert told[0]["details"]["epoch"] == 5
    master.close()

    # No look of the fleet shows it: not the status, not the war room.
    config = operator_config(secure, tmp_path)
    code, out, _ = run(capsys, "status", "--config", config, "--json", "--wait", "1")
    assert code == 0
    assert str(spec_b) not in out
    code, out, _ = run(capsys, "warroom", "--config", config, "--json")
    assert (code, out) == (0, "")

    # Re-rendered without it and reloaded, the broker refuses its old credential.
    old_creds = secure.creds("spec_b")
    assert try_connect(old_creds) == SUCCESS
    rerender(secure, without(fleet, "spec_b"))
    assert reload_broker(secure) == 0
    capsys.readouterr()
    assert try_connect(old_creds) == NOT_AUTHORIZED
    assert try_connect(secure.creds("spec_a")) == SUCCESS


def test_retire_leaves_a_running_masters_post_to_the_master(
    fleet_broker: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = fleet_broker
    leave_behind(secure, coord_active=True)
    new_fleet = write_fleet(without(secure.fleet, "spec_b"), tmp_path / "new.toml")
    code, _, err = retire(capsys, secure, "spec_b", new_fleet, "--wait", "1")
    coord, spec_b = secure.fleet.agent("coord").id, secure.fleet.agent("spec_b").id
    assert code == 1
    assert err == (
        f"vox: error: still on the broker: {topics.warroom(coord, spec_b)}: coord is running "
        "and still holds it: reload it with its new bundle (systemctl reload vox-agent@coord)\n"
    )


def test_retire_refuses_a_running_agent(
    fleet_broker: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = fleet_broker
    spec_b = secure.fleet.agent("spec_b").id
    client = Client(secure.creds("spec_b"))
    client.connect()
    payload = status_payload(secure.fleet, "spec_b", "ACTIVE", None, 2)
    assert client.publish(topics.status(spec_b), payload, retain=True) in ACCEPTED
    client.close()
    new_fleet = write_fleet(without(secure.fleet, "spec_b"), tmp_path / "new.toml")
    code, out, err = retire(capsys, secure, "spec_b", new_fleet, "--wait", "1")
    assert (code, out) == (1, "")
    assert err == (
        "vox: error: 'spec_b' is still running (ACTIVE, epoch 2): stop it first "
        "(systemctl disable --now vox-agent@spec_b), or pass --force\n"
    )
    # Nothing was touched.
    watch_status(secure, "spec_b", spec_b).close()


def test_retire_refuses_what_it_cannot_do(
    fleet_broker: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = fleet_broker
    fleet_file = write_fleet(secure.fleet, tmp_path / "fleet.toml")
    code, _, err = retire(capsys, secure, "spec_b", fleet_file)
    spec_b = secure.fleet.agent("spec_b").id
    assert code == 2
    assert err == (
        f"vox: error: 'spec_b' ({spec_b}) is still in the fleet file: remove it there first "
        "(`vox fleet diff OLD NEW` shows every step)\n"
    )
    code, _, err = retire(capsys, secure, "ghost", fleet_file)
    assert code == 2
    assert err == (
        f"vox: error: 'ghost' is not an agent of the fleet {secure.dir.root}/render.json was "
        "rendered from\n"
    )


def test_retire_checks_the_fleet_file_against_the_broker_s_render_record(
    fleet_broker: SecureBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another fleet's file, or an identity that is no agent: one line, nothing said or cleared."""
    secure = fleet_broker
    fleet = secure.fleet
    spec_b = fleet.agent("spec_b").id
    leave_behind(secure, coord_active=False)
    master = watch_status(secure, "coord", spec_b)

    # Another fleet (its own operator and ids) that has no spec_b either.
    other = write_fleet(without(tree_fleet(SHAPE), "spec_b"), tmp_path / "other.toml")
    code, out, err = retire(capsys, secure, "spec_b", other)
    assert (code, out) == (2, "")
    assert err.startswith("vox: error: the fleet file is not the fleet "), err
    assert err.count("\n") == 1
    # Same operator, but the names carry other ids: not the fleet the broker runs either.
    text = write_fleet(without(fleet, "spec_b"), tmp_path / "new.toml").read_text()
    edited = tmp_path / "edited.toml"
    edited.write_text(text.replace(str(fleet.agent("spec_a").id), str(uuid4())))
    code, _, err = retire(capsys, secure, "spec_b", edited)
    assert code == 2
    assert "'spec_a' has another id there" in err

    new_fleet = tmp_path / "new.toml"
    for name in ("operator", fleet.operator_name, "_status", "_canary", "explorer", "_exporter"):
        code, out, err = retire(capsys, secure, name, new_fleet)
        assert (code, out) == (2, ""), (name, out)
        assert err == (
            f"vox: error: {name!r} is one of the operator's or the broker's own identities, not "
            "an agent: only an agent is retired\n"
        )
    # Nothing reached the master, and spec_b's status is still retained.
    assert not any(not m.retain for m in master.messages)
    master.close()
    watch_status(secure, "spec_b", spec_b).close()
    # With its own fleet file it retires.
    code, _, err = retire(capsys, secure, "spec_b", new_fleet)
    assert (code, err) == (0, "")
