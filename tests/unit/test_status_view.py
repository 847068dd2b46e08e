"""FleetView: epochs, stale wills, staleness on the observer's own clock."""

from __future__ import annotations

from uuid import uuid4

from vox_mqtt.observe.status import FleetView
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, VOXMessage, new_message


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


AGENT = uuid4()
MASTER = uuid4()


def status(
    state: str,
    epoch: int,
    *,
    code: str | None = None,
    started: str = "2026-01-01T00:00:00+00:00",
    commands: list[str] | None = None,
    sequence: int | None = None,
    metrics: dict[str, int] | None = None,
) -> VOXMessage:
    report = AgentStatus(
        name="spec",
        status=state,
        error_code=code,
        epoch=epoch,  # type: ignore[arg-type]
        started_at=started,
        heartbeat_interval=1.0,
        commands=commands or ["analyze"],
        sequence=sequence,
        metrics=metrics or {},
    )
    return new_message(MSG_AGENT_STATUS, source=AGENT, target=MASTER, details=report)


def test_birth_will_and_rebirth() -> None:
    changes: list[tuple[str, str]] = []
    view = FleetView(on_status_change=lambda a, old, new: changes.append((old, new)))
    view.update(status("ACTIVE", 1))
    view.update(status("INACTIVE", 1, code="VM_CONNECTION_LOST"))
    view.update(status("ACTIVE", 2))
    assert changes == [("UNKNOWN", "ACTIVE"), ("ACTIVE", "INACTIVE"), ("INACTIVE", "ACTIVE")]
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.epoch == 2
    assert entry.healthy


def test_delayed_will_of_an_older_epoch_is_ignored() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 5))
    assert view.update(status("INACTIVE", 4, code="VM_CONNECTION_LOST")) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == "ACTIVE"
    assert entry.epoch == 5


def test_wiped_state_dir_restarts_epoch_but_a_later_start_wins() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 9, started="2026-01-01T00:00:00+00:00"))
    view.update(status("ACTIVE", 1, started="2026-01-02T00:00:00+00:00"))
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.epoch == 1


def test_a_wiped_agent_back_at_the_same_epoch_after_its_will_is_active_again() -> None:
    # Its state dir wiped, the agent starts at epoch 1 again, as its last session did.
    view = FleetView()
    view.update(status("ACTIVE", 1, started="2026-01-01T00:00:00+00:00"))
    view.update(
        status("INACTIVE", 1, code="VM_CONNECTION_LOST", started="2026-01-01T00:00:00+00:00")
    )
    view.update(status("ACTIVE", 1, started="2026-01-02T00:00:00+00:00"))
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == "ACTIVE"


def test_a_heartbeat_of_the_same_session_after_its_will_is_a_leftover() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 1))
    view.update(status("INACTIVE", 1, code="VM_CONNECTION_LOST"))
    assert view.update(status("ACTIVE", 1)) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == "INACTIVE"


def test_heartbeat_older_than_three_intervals_is_stale_then_fresh_again() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    view.update(status("ACTIVE", 1))
    clock.now += 2.9
    assert view.refresh() == []
    clock.now += 0.2
    [change] = view.refresh()
    assert (change.old, change.new) == ("ACTIVE", "STALE")
    assert view.commands_of([AGENT]) == set()  # a stale child is no route
    view.update(status("ACTIVE", 1))
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.status == "ACTIVE"
    assert view.commands_of([AGENT]) == {"analyze"}


def test_inactive_agent_advertises_nothing() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 1))
    view.update(status("INACTIVE", 1, code="SHUTDOWN"))
    assert view.commands_of([AGENT]) == set()


def test_retained_status_ages_from_its_emitted_at() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    old = status("ACTIVE", 1).model_copy(update={"emitted_at": "2020-01-01T00:00:00+00:00"})
    change = view.update(old, retained=True)
    assert change is not None
    assert change.new == "STALE"


def presence(state: str, epoch: int, *, code: str | None = None) -> VOXMessage:
    """The same liveness on the presence topic: no commands, addressed to the agent itself."""
    report = AgentStatus(
        name="spec",
        status=state,
        error_code=code,
        epoch=epoch,  # type: ignore[arg-type]
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        commands=[],
    )
    return new_message(MSG_AGENT_STATUS, source=AGENT, target=AGENT, details=report)


def test_a_presence_brings_the_liveness_and_keeps_the_status_report() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 1, commands=["analyze", "sleep"]))
    view.update(presence("ACTIVE", 1), presence=True)
    entry = view.get(AGENT)
    assert entry is not None
    assert (entry.master_id, entry.commands, entry.rejected) == (MASTER, ("analyze", "sleep"), None)
    # The will lands on the presence: INACTIVE, and the commands go with it.
    view.update(presence("INACTIVE", 1, code="VM_CONNECTION_LOST"), presence=True)
    assert (entry.status, entry.error_code, entry.commands) == (
        "INACTIVE",
        "VM_CONNECTION_LOST",
        (),
    )
    # The status retained from before the crash (same epoch, ACTIVE) is a leftover.
    assert view.update(status("ACTIVE", 1), retained=True) is None
    assert entry.status == "INACTIVE"
    assert entry.master_id == MASTER


def test_a_birth_seen_first_on_the_presence_waits_for_its_commands() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 1, commands=["old"]))
    view.update(presence("ACTIVE", 2), presence=True)
    entry = view.get(AGENT)
    assert entry is not None
    assert (entry.status, entry.epoch, entry.commands) == ("ACTIVE", 2, ())
    view.update(status("ACTIVE", 2, commands=["new"]))
    assert entry.commands == ("new",)
    # Heartbeats on the presence change nothing of them, nor count as advertisement changes.
    for _ in range(100):
        view.update(presence("ACTIVE", 2), presence=True)
    assert (entry.commands, entry.rejected) == (("new",), None)


def test_a_replayed_older_status_of_the_same_epoch_is_ignored() -> None:
    clock = Clock()
    view = FleetView(clock=clock)
    old = status("ACTIVE", 3, sequence=1, metrics={"messages_in": 1})
    view.update(old)
    view.update(status("ACTIVE", 3, sequence=5, metrics={"messages_in": 9}))
    clock.now += 2.5
    # The older one again, and the newest again: neither is news, neither refreshes it.
    assert view.update(old) is None
    assert view.update(status("ACTIVE", 3, sequence=5)) is None
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.metrics == {"messages_in": 9}
    clock.now += 1.0
    assert [c.new for c in view.refresh()] == ["STALE"]  # replays kept nothing fresh
    # The next genuine one is taken; so is the will, which has no sequence.
    assert view.update(status("ACTIVE", 3, sequence=6)) is not None
    assert view.update(status("INACTIVE", 3, code="VM_CONNECTION_LOST")) is not None


def test_sequences_count_per_epoch_start_and_topic() -> None:
    view = FleetView()
    view.update(status("ACTIVE", 3, sequence=9))
    # The presence counts on its own: a low sequence there is not a replay of the status.
    assert view.update(status("ACTIVE", 3, sequence=2), presence=True) is None  # no change
    entry = view.get(AGENT)
    assert entry is not None
    assert entry.sequences[True][2] == 2
    # A new epoch, or the same epoch from a later start (a wiped state dir), starts over.
    view.update(status("ACTIVE", 4, sequence=1, metrics={"messages_in": 4}))
    assert entry.sequences[False][2] == 1
    assert entry.metrics == {"messages_in": 4}
    later = "2026-01-02T00:00:00+00:00"
    view.update(status("ACTIVE", 4, sequence=1, started=later, metrics={"messages_in": 1}))
    assert entry.sequences[False] == (4, later, 1)
    assert entry.metrics == {"messages_in": 1}


def test_the_tree_is_laid_out_from_the_top_children_by_name_the_unplaced_last() -> None:
    # cli/statusview._tree_order: what `vox status`, `vox watch` and the console draw. It
    # finds every agent's children in one pass (docs/performance.md, "The tree's order").
    from types import SimpleNamespace

    from vox_mqtt.cli.statusview import _tree_order
    from vox_mqtt.observe.observer import FleetObserver

    observer = FleetObserver(stale_after=30.0)
    top, coordinator, lone = uuid4(), uuid4(), uuid4()
    names = {top: "root", coordinator: "coordinator", lone: "lone"}
    leaves = {uuid4(): name for name in ("spec-b", "spec-a", "spec-c")}
    names |= leaves
    masters = {top: uuid4(), coordinator: top, lone: uuid4(), **dict.fromkeys(leaves, coordinator)}
    for agent, name in names.items():
        report = AgentStatus(
            name=name,
            status="ACTIVE",
            epoch=1,  # type: ignore[arg-type]
            started_at="2026-01-01T00:00:00+00:00",
            heartbeat_interval=1.0,
            commands=[],
        )
        observer.view.update(
            new_message(MSG_AGENT_STATUS, source=agent, target=masters[agent], details=report)
        )
    agents = {entry.id: entry for entry in observer.view.agents()}
    order = _tree_order(SimpleNamespace(top=top), observer, agents)  # type: ignore[arg-type]
    assert [(depth, entry.name) for depth, entry in order] == [
        (0, "root"),
        (1, "coordinator"),
        (2, "spec-a"),
        (2, "spec-b"),
        (2, "spec-c"),
        (1, "lone"),  # its master is nobody here: nobody knows where it hangs
    ]
    # Only the agents asked for are laid out (an overlay may leave some out).
    del agents[coordinator]
    order = _tree_order(SimpleNamespace(top=top), observer, agents)  # type: ignore[arg-type]
    assert [(depth, entry.name) for depth, entry in order][:1] == [(0, "root")]
    assert {entry.name for _, entry in order} == {"root", "spec-a", "spec-b", "spec-c", "lone"}
