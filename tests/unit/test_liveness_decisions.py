"""Liveness's decisions, pure: when our own status goes out again (agent/ownstatus.py), and
whose a name or a master is as the agent knows it (agent/childwatch.py, F26)."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import pytest

from vox_mqtt.agent.childwatch import fleet_word, master_of, named
from vox_mqtt.agent.ownstatus import own_status_answer
from vox_mqtt.agent.reconcile import CATCH_UP
from vox_mqtt.observe.status import FleetView, FleetWord
from vox_mqtt.protocol.settings import AgentConfig, BrokerSettings
from vox_mqtt.protocol.signing import Signing

ME, MASTER, CHILD, PEER, PEERS_MASTER = uuid4(), uuid4(), uuid4(), uuid4(), uuid4()
BORN = 100.0
INTERVAL = 5.0


def answer(**change: object) -> str | None:
    """Our status answered against a live one of epoch 3 while we are in epoch 4."""
    given: dict[str, object] = {
        "their_epoch": 3,
        "our_epoch": 4,
        "retained": False,
        "online": True,
        "now": BORN + 60,
        "born_at": BORN,
        "backlog_answered": None,
        "replay_answered_at": -float("inf"),
        "interval": INTERVAL,
    }
    given.update(change)
    return own_status_answer(**given)  # type: ignore[arg-type]


def test_an_older_live_status_of_ours_is_answered() -> None:
    assert answer() == "replay"


@pytest.mark.parametrize(
    "change",
    [
        {"retained": True},  # the previous session's last word, before our birth
        {"their_epoch": 4},  # our own, current
        {"their_epoch": 5},  # newer than ours: not an intruder's replay
        {"their_epoch": "3"},  # no epoch to compare
        {"online": False},  # the birth covers it
    ],
)
def test_what_is_not_answered(change: dict[str, object]) -> None:
    assert answer(**change) is None


def test_a_replay_is_answered_once_per_heartbeat_interval() -> None:
    now = BORN + 60
    assert answer(now=now, replay_answered_at=now - INTERVAL / 2) is None
    assert answer(now=now, replay_answered_at=now - INTERVAL) == "replay"


def test_the_backlog_after_a_birth_is_answered_once_outside_the_allowance() -> None:
    just_after = BORN + CATCH_UP / 2
    # Our previous session's will, queued for us: answered even right after a replay's answer.
    assert answer(now=just_after, replay_answered_at=just_after) == "backlog"
    # Once per connection: the next is a replay, within the allowance.
    assert answer(now=just_after, backlog_answered=BORN, replay_answered_at=just_after) is None
    assert answer(now=just_after, backlog_answered=BORN) == "replay"
    # Past the catch-up the queue is delivered: a late one is a replay.
    assert answer(now=BORN + CATCH_UP) == "replay"
    assert answer(now=just_after, born_at=None) == "replay"  # never born: no backlog


def config(tmp_path: Path, *, signing: Signing | None = None) -> AgentConfig:
    return AgentConfig(
        id=ME,
        name="coord",
        master_id=MASTER,
        master_name="root",
        children={CHILD: "spec"},
        state_dir=tmp_path,
        broker=BrokerSettings(client_id="coord", signing=signing),
    )


def signed(mode: str = "require") -> Signing:
    return Signing(mode=mode, roster={PEER: ("peer", PEERS_MASTER)})  # type: ignore[arg-type]


def test_a_child_s_name_and_master_are_the_config_s(tmp_path: Path) -> None:
    assert fleet_word(config(tmp_path), CHILD) == FleetWord(name="spec", master=ME)
    assert fleet_word(config(tmp_path), PEER) is None


def test_anyone_else_s_come_from_the_signed_bundle_when_signatures_are_on(tmp_path: Path) -> None:
    on = config(tmp_path, signing=signed())
    assert fleet_word(on, PEER) == FleetWord(name="peer", master=PEERS_MASTER)
    assert fleet_word(on, CHILD) == FleetWord(name="spec", master=ME)  # the config first
    assert fleet_word(config(tmp_path, signing=signed("off")), PEER) is None


def test_whose_a_name_is(tmp_path: Path) -> None:
    plain = config(tmp_path)
    assert [named(plain, n) for n in ("coord", "root", "spec", "peer")] == [ME, MASTER, CHILD, None]
    assert named(config(tmp_path, signing=signed()), "peer") == PEER
    assert named(config(tmp_path, signing=signed("off")), "peer") is None


def test_the_root_names_no_master(tmp_path: Path) -> None:
    root = AgentConfig(
        id=ME, name="root", master_id=None, state_dir=tmp_path, broker=BrokerSettings(client_id="r")
    )
    assert named(root, "master") is None


def test_an_agent_s_master_from_the_config_then_the_statuses(tmp_path: Path) -> None:
    view = FleetView()
    seen = view.watch(PEER)
    known = config(tmp_path)
    assert master_of(known, ME, view) == MASTER
    assert master_of(known, CHILD, view) == ME
    assert master_of(known, PEER, view) is None
    seen.master_id = PEERS_MASTER
    assert master_of(known, PEER, view) == PEERS_MASTER
    assert master_of(known, uuid4(), view) is None
