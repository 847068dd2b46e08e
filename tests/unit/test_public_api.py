"""The public API: `vox_mqtt` exports it, and the import paths the first waves used still work."""

from __future__ import annotations

import importlib

import pytest

import vox_mqtt

# (old import path, name, the module that defines it now)
FIRST_WAVES = [
    ("vox_mqtt.messages", "VOXMessage", "vox_mqtt.protocol.messages"),
    ("vox_mqtt.messages", "JobDetected", "vox_mqtt.protocol.domain"),
    ("vox_mqtt.errors", "CommandFailed", "vox_mqtt.protocol.errors"),
    ("vox_mqtt.topics", "inbox", "vox_mqtt.protocol.topics"),
    ("vox_mqtt.hierarchy", "load_fleet", "vox_mqtt.protocol.hierarchy"),
    ("vox_mqtt.roles", "Role", "vox_mqtt.agent.roles"),
    ("vox_mqtt.roles", "command", "vox_mqtt.agent.roles"),
    ("vox_mqtt.memory", "VOXAgentMemory", "vox_mqtt.ledger.store"),
    ("vox_mqtt.ledger", "VOXAgentMemory", "vox_mqtt.ledger.store"),
    ("vox_mqtt.agent", "VOXAgent", "vox_mqtt.agent.facade"),
    ("vox_mqtt.transport", "Session", "vox_mqtt.transport.session"),
    ("vox_mqtt.transport", "BrokerSettings", "vox_mqtt.transport.session"),
]


@pytest.mark.parametrize(("old", "name", "home"), FIRST_WAVES)
def test_an_old_import_path_gives_the_same_object(old: str, name: str, home: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(home), name
    )


def test_the_package_exports_what_its_all_names() -> None:
    missing = [name for name in vox_mqtt.__all__ if not hasattr(vox_mqtt, name)]
    assert missing == []
    assert vox_mqtt.VOXAgent.__module__ == "vox_mqtt.agent.facade"
