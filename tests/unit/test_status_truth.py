"""FleetView: the full status says no state, a will dated by the broker (docs/liveness.md),
signed statuses dated by their emitted_at (F23), names and masters from the fleet (F26)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from vox_mqtt.observe.status import (
    ACTIVE,
    INACTIVE,
    STALE,
    UNKNOWN,
    FleetView,
    FleetWord,
    StatusChange,
)
from vox_mqtt.observe.statusbounds import WILL_EXPIRY, Timeliness
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, VOXMessage, new_message

AGENT, MASTER, OTHER = uuid4(), uuid4(), uuid4()
STARTED = "2026-01-01T00:00:00+00:00"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(
    state: str | None,
    epoch: int,
    *,
    presence: bool = False,
    code: str | None = None,
    name: str = "spec",
    target: object = None,
    sequence: int | None = None,
    commands: list[str] | None = None,
    age: float = 0.0,
) -> VOXMessage:
    report = AgentStatus(
        name=name,
        status=state,
        error_code=code,
        epoch=epoch,
        started_at=STARTED,
        heartbeat_interval=1.0,
        commands=[] if presence else (["analyze"] if commands is None else commands),
        sequence=sequence,
    )
    to = AGENT if presence else (MASTER if target is None else target)
    built = new_message(MSG_AGENT_STATUS, source=AGENT, target=to, details=report)  # type: ignore[arg-type]
    if not age:
        return built
    when = (datetime.now(UTC) - timedelta(seconds=age)).isoformat()
    return built.model_copy(update={"emitted_at": when})


def up(
    view: FleetView,
    state: str | None,
    epoch: int,
    *,
    retained: bool = False,
    expiry_left: float | None = None,
    **kw: object,
) -> StatusChange | None:
    """Apply one status to the view, on the topic it names (presence=True: the presence)."""
    presence = bool(kw.get("presence", False))
    built = message(state, epoch, **kw)  # type: ignore[arg-type]
    return view.update(built, retained=retained, presence=presence, expiry_left=expiry_left)


def test_the_full_status_of_a_running_agent_carries_no_state_word() -> None:
    report = AgentStatus(name="spec", epoch=1, started_at=STARTED, heartbeat_interval=1.0)
    details = new_message(MSG_AGENT_STATUS, source=AGENT, target=MASTER, details=report).details
    assert "status" not in details


def test_a_report_brings_commands_and_the_presence_the_liveness() -> None:
    view = FleetView()
    assert up(view, None, 1, sequence=1) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == UNKNOWN
    assert entry.commands == ("analyze",)
    change = up(view, ACTIVE, 1, presence=True, sequence=2)
    assert change is not None
    assert change.new == ACTIVE
    assert entry.commands == ("analyze",)
    assert entry.master_id == MASTER
    assert view.commands_of([AGENT]) == {"analyze"}


def test_a_report_read_after_the_will_neither_revives_nor_advertises() -> None:
    # An explorer's order at subscribe time: the will on the presence, then the last report.
    view = FleetView()
    up(view, INACTIVE, 3, presence=True, code="VM_CONNECTION_LOST", retained=True)
    up(view, None, 3, sequence=7, retained=True)
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == INACTIVE
    assert not entry.commands
    assert view.commands_of([AGENT]) == set()
    # The next session's report comes before its presence: ACTIVE only with the presence.
    up(view, None, 4, sequence=1)
    assert entry.status == INACTIVE
    assert entry.commands == ("analyze",)
    assert view.commands_of([AGENT]) == set()
    up(view, ACTIVE, 4, presence=True, sequence=2)
    assert entry.status == ACTIVE
    assert view.commands_of([AGENT]) == {"analyze"}


def test_a_report_of_an_older_session_is_ignored() -> None:
    view = FleetView()
    up(view, ACTIVE, 5, presence=True, sequence=1)
    up(view, None, 5, sequence=2, commands=["new"])
    up(view, None, 4, sequence=9, commands=["old"])
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.commands == ("new",)


def test_a_retained_will_is_dated_by_the_expiry_the_broker_counted_down() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    # Built at connect an hour ago; the broker published it 42 s ago.
    will = message(INACTIVE, 2, presence=True, code="VM_CONNECTION_LOST", age=3600)
    view.update(will, retained=True, presence=True, expiry_left=WILL_EXPIRY - 42)
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.lost_at_known
    assert entry.received_at == clock.now - 42


def test_a_retained_will_without_expiry_is_dated_at_most() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    will = message(INACTIVE, 2, presence=True, code="VM_CONNECTION_LOST", age=3600)
    view.update(will, retained=True, presence=True)
    entry = view.get(AGENT)
    assert entry is not None
    assert not entry.lost_at_known
    assert abs(entry.received_at - (clock.now - 3600)) < 5
    # A bigger expiry than ours is not a will's: not dated by it.
    view2 = FleetView(clock=clock)
    view2.update(will, retained=True, presence=True, expiry_left=WILL_EXPIRY + 10)
    second = view2.get(AGENT)
    assert second is not None
    assert not second.lost_at_known


def signed_view(clock: Clock | None = None) -> FleetView:
    view = FleetView(clock=clock or Clock())
    view.timeliness = Timeliness(window=60.0, skew=1.0)
    return view


def test_a_live_status_of_life_older_than_the_window_is_never_taken() -> None:
    for retained in (False, True):
        view = signed_view()
        assert up(view, ACTIVE, 1, presence=True, age=120, retained=retained) is None
        assert up(view, None, 1, sequence=1, age=120, retained=retained) is None
        entry = view.get(AGENT)
        assert entry is not None
        assert entry.status == UNKNOWN
        assert entry.commands == ()
        assert view.not_current == 2
        assert entry.rejected is None  # old is not misbehaving


def test_an_inactive_is_taken_whatever_its_age() -> None:
    view = signed_view()
    up(view, ACTIVE, 1, presence=True, sequence=1)
    # The will is built at connect: a day-old session's will is news all the same.
    change = up(view, INACTIVE, 1, presence=True, code="VM_CONNECTION_LOST", age=86400)
    assert change is not None
    assert change.new == INACTIVE


def test_a_replayed_heartbeat_within_the_window_is_aged_by_its_emitted_at() -> None:
    clock = Clock()
    view = signed_view(clock)
    # Captured 10 s ago (stale after 3 intervals of 1 s, 1 s of skew allowed): STALE at once.
    change = up(view, ACTIVE, 1, presence=True, sequence=4, age=10)
    assert change is not None
    assert change.new == STALE
    assert view.commands_of([AGENT]) == set()
    # A genuine fresh one is ACTIVE.
    fresh = signed_view(clock)
    change = up(fresh, ACTIVE, 1, presence=True, sequence=4, age=0.5)
    assert change is not None
    assert change.new == ACTIVE


def test_unsigned_views_date_a_live_status_by_its_arrival() -> None:
    view = FleetView()
    change = up(view, ACTIVE, 1, presence=True, sequence=1, age=10)
    assert change is not None
    assert change.new == ACTIVE


def worded_view(rejects: list[str]) -> FleetView:
    view = FleetView()
    words = {AGENT: FleetWord(name="spec", master=MASTER), OTHER: FleetWord(name="root")}
    view.fleet_word = words.get
    view.named = {"spec": AGENT, "root": OTHER}.get
    view.add_reject_listener(lambda _entry, reason: rejects.append(reason))
    return view


def test_a_status_claiming_another_name_is_refused_and_the_fleets_name_shown() -> None:
    rejects: list[str] = []
    view = worded_view(rejects)
    assert up(view, None, 1, sequence=1, name="root") is None
    assert up(view, ACTIVE, 1, presence=True, name="root") is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.name == "spec"
    assert entry.master_id == MASTER
    assert entry.misbehaving()
    assert len(rejects) == 2
    assert "claims the name 'root' of another identity" in rejects[0]


def test_a_name_of_no_known_identity_is_shown_as_the_fleets_and_not_refused() -> None:
    # A renamed agent restarts under its new name before its master reloads.
    rejects: list[str] = []
    view = worded_view(rejects)
    up(view, None, 1, sequence=1, name="analyst")
    up(view, ACTIVE, 1, presence=True, sequence=2, name="analyst")
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.healthy
    assert entry.name == "spec"
    assert rejects == []


def test_a_status_claiming_another_master_is_refused() -> None:
    rejects: list[str] = []
    view = worded_view(rejects)
    assert up(view, None, 1, sequence=1, target=OTHER) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.master_id == MASTER
    assert entry.misbehaving()
    assert f"claims {OTHER} as its master" in rejects[0]


def test_the_fleets_word_holds_and_a_status_to_the_war_room_is_no_claim() -> None:
    rejects: list[str] = []
    view = worded_view(rejects)
    up(view, None, 1, sequence=1, target=topics.WARROOM_ID)
    up(view, ACTIVE, 1, presence=True, sequence=2)
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.healthy
    assert entry.master_id == MASTER
    assert rejects == []
