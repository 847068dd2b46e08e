"""One liveness text for every view: heartbeat age when live, "down for" when not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from vox_mqtt.cli._downtime import liveliness
from vox_mqtt.observe.status import FleetView
from vox_mqtt.observe.statusbounds import WILL_EXPIRY
from vox_mqtt.observe.warroom import Incident, SystemFailure
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, new_message
from vox_mqtt.protocol.topics import WARROOM_ID, WarroomTopic

AGENT, MASTER = uuid4(), uuid4()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(state: str, code: str | None, *, ago: float = 0.0, epoch: int = 1):  # type: ignore[no-untyped-def]
    message = new_message(
        MSG_AGENT_STATUS,
        source=AGENT,
        target=MASTER,
        details={
            "name": "spec_a",
            "status": state,
            "error_code": code,
            "epoch": epoch,
            "started_at": "2026-01-01T00:00:00+00:00",
            "heartbeat_interval": 1.0,
        },
    )
    sent = (datetime.now(UTC) - timedelta(seconds=ago)).isoformat(timespec="milliseconds")
    return message.model_copy(update={"emitted_at": sent})


def loss_post(*, ago: float, epoch: int = 1, code: str = "VM_CONNECTION_LOST") -> Incident:
    failure = SystemFailure(
        error_code=code, severity="CRITICAL", description="lost", subject=AGENT, epoch=epoch
    )
    message = new_message(MSG_SYSTEM_FAILURE, source=MASTER, target=WARROOM_ID, details=failure)
    sent = (datetime.now(UTC) - timedelta(seconds=ago)).isoformat(timespec="milliseconds")
    message = message.model_copy(update={"emitted_at": sent})
    return Incident(WarroomTopic(source=MASTER, subject=AGENT), message, failure)


def test_live_agents_have_a_heartbeat_age_and_no_downtime() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    view.update(status("ACTIVE", None))
    clock.now += 0.8
    live = liveliness(view.get(AGENT), now=clock.now)  # type: ignore[arg-type]
    assert (live.down_for, live.text()) == (None, "heartbeat 0.8s ago")


def test_a_stale_agent_is_down_since_its_last_heartbeat() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    view.update(status("ACTIVE", None))
    clock.now += 312.4
    view.refresh()
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == "STALE"
    assert liveliness(entry, now=clock.now).text() == "down for 5m 12s"


def test_a_will_seen_live_dates_the_loss_and_a_retained_one_is_only_a_bound() -> None:
    clock = Clock()
    live_view = FleetView(clock=clock)
    live_view.update(status("ACTIVE", None))
    live_view.update(status("INACTIVE", "VM_CONNECTION_LOST", ago=600))  # built at connect
    clock.now += 3.0
    entry = live_view.get(AGENT)
    assert entry is not None
    assert liveliness(entry, now=clock.now).text() == "down for 3.0s"

    late_view = FleetView(clock=clock)  # a look that finds the will retained
    late_view.update(status("INACTIVE", "VM_CONNECTION_LOST", ago=600), retained=True)
    entry = late_view.get(AGENT)
    assert entry is not None
    bound = liveliness(entry, now=clock.now)
    assert (bound.at_most, bound.text()) == (True, "down for ≤ 10m 00s")
    # The master's war-room post dates it; a post of another epoch or a host alert does not.
    noise = [loss_post(ago=5, epoch=7), loss_post(ago=9, code="DISK_FULL")]
    dated = liveliness(entry, [*noise, loss_post(ago=42.0)], now=clock.now)
    assert dated.at_most is False
    assert dated.down_for is not None
    assert 41.5 < dated.down_for < 43.5
    assert liveliness(entry, noise, now=clock.now).at_most is True


def test_a_shutdown_is_dated_by_its_own_time() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    view.update(status("INACTIVE", "SHUTDOWN", ago=75), retained=True)
    entry = view.get(AGENT)
    assert entry is not None
    down = liveliness(entry, now=clock.now)
    assert down.at_most is False
    assert down.text().startswith("down for 1m 1")  # 75 s, give or take a clock tick


def test_a_retained_will_is_dated_by_the_broker_through_its_expiry_left() -> None:
    clock = Clock()
    view = FleetView(clock=clock)  # a look (an explorer's) that finds the will retained
    will = status("INACTIVE", "VM_CONNECTION_LOST", ago=600)  # built at connect, 10 min ago
    view.update(will, retained=True, presence=True, expiry_left=WILL_EXPIRY - 42)
    entry = view.get(AGENT)
    assert entry is not None
    dated = liveliness(entry, now=clock.now)
    assert (dated.at_most, dated.text()) == (False, "down for 42.0s")
