"""The heartbeat's cadence: a fixed rate, no burst after a stall (vox_mqtt/agent/cadence.py)."""

from __future__ import annotations

import pytest

from vox_mqtt.agent.cadence import next_heartbeat


def test_a_late_beat_does_not_push_the_next_one_later() -> None:
    # Due at 15, sent at 15.9 (the tick's wait): the next is due at 30, not 30.9.
    assert next_heartbeat(15.0, 15.9, 15.0) == 30.0


def test_a_beat_on_time_keeps_the_cadence() -> None:
    assert next_heartbeat(15.0, 15.0, 15.0) == 30.0


def test_the_rate_over_many_late_beats_is_one_per_interval() -> None:
    due, sent = 15.0, []
    for lateness in [0.9, 0.1, 0.99, 0.5, 0.0, 0.75] * 10:
        now = due + lateness
        sent.append(now)
        due = next_heartbeat(due, now, 15.0)
    # Sixty beats span 59 intervals, whatever each one's lateness within its tick.
    assert sent[-1] - sent[0] == pytest.approx(59 * 15.0, abs=1.0)


@pytest.mark.parametrize("now", [30.0, 31.0, 100.0])
def test_a_beat_held_past_a_whole_interval_restarts_the_cadence_from_now(now: float) -> None:
    # No catch-up burst of the beats a stalled loop missed.
    assert next_heartbeat(15.0, now, 15.0) == now + 15.0
