"""The broker queue `vox broker render` sizes to the fleet (docs/broker.md)."""

from __future__ import annotations

from pathlib import Path

from vox_mqtt.broker.reload import conf_directives
from vox_mqtt.broker.render import queue_limits, render_conf

MIB = 2**20


def test_the_queue_holds_every_retained_message_of_the_fleet_and_the_old_room() -> None:
    # Two liveness topics and at most two war-room posts per agent, plus 1,000.
    assert queue_limits(0) == (1000, 256 * MIB)
    assert queue_limits(1000)[0] == 5000
    messages, queued_bytes = queue_limits(10_000)
    assert messages == 41_000
    assert queued_bytes == 256 * MIB  # what 1,000 messages of 256 KiB could always take
    assert queue_limits(100_000) == (401_000, 4096 * 401_000)


def test_the_rendered_config_carries_the_fleet_sized_queue() -> None:
    text = render_conf(
        root=Path("/etc/vox/broker"),
        fmt="acl",
        bind="127.0.0.1",
        port=1883,
        tls_port=None,
        run_as_user="mosquitto",
        agents=10_011,
    )
    settings = dict(conf_directives(text))
    assert settings["max_queued_messages"] == "41044"
    assert settings["max_queued_bytes"] == str(256 * MIB)
    assert settings["max_inflight_messages"] == "20"
