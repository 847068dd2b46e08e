"""logonce.Repeats: a failure retried at every tick is logged once a while."""

from __future__ import annotations

import logging

import pytest

from vox_mqtt.agent.logonce import Repeats


def test_a_repeated_text_is_said_once_then_again_after_the_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.logonce")
    said = Repeats(logger, every=0.2)
    with caplog.at_level(logging.DEBUG, logger="test.logonce"):
        for _ in range(5):
            said.log(logging.WARNING, "refused")
        said.log(logging.WARNING, "another")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "refused"),
        *[("DEBUG", "refused")] * 4,
        ("WARNING", "another"),
    ]
    said.every = 0.0
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="test.logonce"):
        said.log(logging.WARNING, "refused")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
