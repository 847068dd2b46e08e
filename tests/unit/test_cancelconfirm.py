"""What a master tells of a cancel from its child's cancel_report (agent/cancelconfirm.py)."""

from __future__ import annotations

import time
from typing import Any

from vox_mqtt.agent.cancelconfirm import reported
from vox_mqtt.protocol.canceling import AFTER_CANCEL_WHY

T0 = "2026-12-07T04:27:48.619+00:00"
T1 = "2026-12-07T04:27:57.102+00:00"


def asker(levels: dict[str, Any]) -> tuple[list[float], Any]:
    asked: list[float] = []

    async def ask(within: float) -> dict[str, Any]:
        asked.append(within)
        return levels

    return asked, ask


async def test_an_end_reached_before_the_cancel_is_told_without_asking_the_levels() -> None:
    asked, ask = asker({})
    report = {"request_id": "r", "state": "completed", "since": T1}
    said = await reported(report, ask, "root", time.monotonic() + 5, most=1.0)
    assert asked == []
    assert (said["state"], said["level"]) == ("completed", 1)
    assert said["line"] == f"not canceled, already completed since {T1}"


async def test_an_end_that_came_up_after_an_earlier_cancel_asks_where_it_ran() -> None:
    after = {
        "state": "completed",
        "since": T1,
        "why": AFTER_CANCEL_WHY,
        "history": [{"state": "canceling", "at": T0}, {"state": "completed", "at": T1}],
    }
    levels = {**after, "below": {**after, "below": {"state": "completed", "since": T1}}}
    asked, ask = asker(levels)
    report = {"request_id": "r", "state": "completed", "since": T1, "why": AFTER_CANCEL_WHY}
    said = await reported(report, ask, "root", time.monotonic() + 5, most=1.0)
    assert len(asked) == 1
    assert (said["state"], said["level"]) == ("completed", 3)
    assert said["line"].startswith("canceled at root, level 2, but level 3 had completed")
    assert said["levels"] == levels
