"""The credential store of a broker directory: one 0600 file, read by name or UUID."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.kits.brokerkit import seven_agent_fleet
from vox_mqtt.broker.acl import canary_topic
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.manifest import load_manifest
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.protocol.errors import ConfigError


def test_the_store_answers_by_name_uuid_and_uuid_string(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    rendered = render_broker_dir(fleet, tmp_path / "b", port=18830, explorer=True)
    store = CredentialStore(rendered.root)
    coord = fleet.agent("coord_a")
    by_name = store.get("coord_a")
    assert by_name.username == str(coord.id)
    assert store.get(coord.id) == by_name == store.get(str(coord.id))
    assert by_name.port == 18830
    assert sorted(store.names()) == sorted(rendered.identities)
    assert store.passwords()[str(coord.id)] == by_name.password
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    # Only the renderer reads it: the broker's files never mention it.
    assert "secrets" not in rendered.conf.read_text()


def test_a_missing_or_damaged_store_is_one_clear_line(tmp_path: Path) -> None:
    rendered = render_broker_dir(seven_agent_fleet(), tmp_path / "b", port=18830)
    store = CredentialStore(rendered.root)
    with pytest.raises(ConfigError, match=r"no credentials for .nobody.*vox broker render"):
        store.get("nobody")
    store.path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON") as info:
        store.get("coord_a")
    assert len(info.value.problems) == 1
    store.path.write_text('{"format": "something else", "identities": {}}')
    with pytest.raises(ConfigError, match="re-render the broker"):
        store.get("coord_a")


def test_the_canary_nonce_follows_the_rules_not_the_run(tmp_path: Path) -> None:
    fleet = seven_agent_fleet()
    out = tmp_path / "b"
    render_broker_dir(fleet, out, port=18830)
    nonce = _nonce(out)
    render_broker_dir(fleet, out, port=18830)
    assert _nonce(out) == nonce
    assert f"topic write {canary_topic(nonce)}\n" in (out / "acl").read_text()
    # One identity more: other rules, another nonce.
    render_broker_dir(fleet, out, port=18830, explorer=True)
    assert _nonce(out) != nonce


def _nonce(root: Path) -> str:
    manifest = load_manifest(root)
    assert manifest is not None
    assert manifest.canary_nonce
    return manifest.canary_nonce
