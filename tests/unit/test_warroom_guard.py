"""WarroomGuard: the receiver's check of size, the self-or-child rule and the rate per source."""

from __future__ import annotations

from uuid import UUID, uuid4

from vox_mqtt.observe.warroomguard import WARROOM_MAX_BYTES, WarroomGuard, rule_problem

COORD, CHILD, ROOT = uuid4(), uuid4(), uuid4()
MASTERS = {CHILD: COORD, COORD: ROOT}


def master_of(agent: UUID) -> UUID | None:
    return MASTERS.get(agent)


def test_the_rule_allows_self_and_own_children_only() -> None:
    assert rule_problem(COORD, COORD, master_of) is None
    assert rule_problem(COORD, CHILD, master_of) is None
    assert rule_problem(CHILD, COORD, master_of) is not None  # about its master
    assert rule_problem(CHILD, ROOT, lambda _: None) is None  # unknown: the ACL decides


def test_size_rule_and_rate_are_enforced_and_counted() -> None:
    now = [0.0]
    guard = WarroomGuard(burst=3, interval=1.0, clock=lambda: now[0])
    assert guard.refuse(COORD, CHILD, WARROOM_MAX_BYTES + 1, master_of) is not None
    assert guard.refuse(CHILD, COORD, 100, master_of) is not None
    assert [guard.refuse(COORD, CHILD, 100, master_of) for _ in range(3)] == [None] * 3
    assert "faster than one per 1 s" in (guard.refuse(COORD, CHILD, 100, master_of) or "")
    # Another source has its own budget; time refills the first one.
    assert guard.refuse(CHILD, CHILD, 100, master_of) is None
    now[0] = 1.0
    assert guard.refuse(COORD, CHILD, 100, master_of) is None
    assert guard.dropped == 3


def test_a_flood_from_one_source_is_bounded() -> None:
    now = [0.0]
    guard = WarroomGuard(clock=lambda: now[0])
    taken = 0
    for n in range(100):
        now[0] = n * 0.01  # 100 posts in one second
        taken += guard.refuse(COORD, COORD, 1000, master_of) is None
    assert guard.burst <= taken <= guard.burst + 1
