"""A config file's [broker] timeouts reach the session, and a read-only look bounds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from vox_mqtt.cli.looks import _read_only
from vox_mqtt.fleet.config import BrokerSection


def settings(**broker: float) -> tuple[float, float, float]:
    s = BrokerSection(username="u", password="p", **broker).settings("c", base=Path())
    return s.connect_timeout, s.reconnect_min, s.reconnect_max


def look(**broker: float) -> tuple[float, float, float]:
    s = _read_only(BrokerSection(username="u", password="p", **broker).settings("c", base=Path()))
    return s.connect_timeout, s.reconnect_min, s.reconnect_max


def test_connect_timeout_is_10_s_unless_the_config_says() -> None:
    assert settings() == (10.0, 0.5, 30.0)
    assert settings(connect_timeout=2) == (2.0, 0.5, 30.0)
    with pytest.raises(ValidationError):
        BrokerSection(username="u", connect_timeout=0)


def test_a_look_waits_and_backs_off_at_most_5_s_and_never_below_the_first_window() -> None:
    assert look() == (5.0, 0.5, 5.0)
    assert look(connect_timeout=1, reconnect_min=0.1, reconnect_max=0.5) == (1.0, 0.1, 0.5)
    # An agent's config on a broker of 10,000 agents (docs/federation.md): a 20 s window.
    assert look(reconnect_min=20, reconnect_max=30) == (5.0, 20.0, 20.0)
