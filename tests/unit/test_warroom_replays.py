"""Replayed war-room posts: refused STALE by age, ignored when not newer (docs/security.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.warroom import Incident, apply_warroom
from vox_mqtt.observe.warroomreplay import NOT_NEWER, WarroomOrder, refresh_due
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import new_message, serialize
from vox_mqtt.protocol.signing import STALE, SignedTopic, Signing, payload_digest
from vox_mqtt.transport.session import Inbound

NOW = 1_800_000_000.0
SOURCE, SUBJECT = uuid4(), uuid4()
KEY = (SOURCE, SUBJECT)


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _post(at: float, *, resolved: bool = False, signed: bool = True, text: str = "lost") -> Inbound:
    failure = SystemFailure(
        error_code="VM_CONNECTION_LOST",
        severity="INFO" if resolved else "CRITICAL",
        description=text,
        subject=SUBJECT,
        resolved=resolved,
    )
    message = new_message(
        MSG_SYSTEM_FAILURE, source=SOURCE, target=topics.WARROOM_ID, details=failure
    ).model_copy(update={"emitted_at": _at(at)})
    payload = serialize(message)
    topic: str = topics.warroom(SOURCE, SUBJECT)
    if signed:  # as the session hands on a verified message
        topic = SignedTopic.of(topic, "kid.sig", payload_digest(payload))
    return Inbound(topic=topic, payload=payload, retain=not resolved)


def test_a_signed_post_older_than_the_window_is_stale() -> None:
    order = WarroomOrder(window=600.0, skew=30.0)
    problem = order.judge(KEY, _at(NOW - 631), signed=True, now=NOW)
    assert problem is not None
    assert problem.startswith(f"{STALE}:")
    assert KEY not in order.newest  # never taken
    assert order.judge(KEY, _at(NOW - 629), signed=True, now=NOW) is None


def test_a_post_from_the_future_beyond_the_skew_is_stale() -> None:
    order = WarroomOrder(window=600.0, skew=30.0)
    problem = order.judge(KEY, _at(NOW + 31), signed=True, now=NOW)
    assert problem is not None
    assert problem.startswith(f"{STALE}:")
    assert order.judge(KEY, _at(NOW + 29), signed=True, now=NOW) is None


def test_an_unsigned_post_is_not_judged_by_its_age_but_still_ordered() -> None:
    order = WarroomOrder(window=600.0, skew=30.0)
    assert order.judge(KEY, _at(NOW - 5000), signed=False, now=NOW) is None
    problem = order.judge(KEY, _at(NOW - 6000), signed=False, now=NOW)
    assert problem is not None
    assert problem.startswith(f"{NOT_NEWER}:")


def test_a_post_not_newer_than_the_newest_taken_is_ignored() -> None:
    order = WarroomOrder()
    assert order.judge(KEY, _at(NOW - 10), signed=True, now=NOW) is None  # opened
    assert order.judge(KEY, _at(NOW - 5), signed=True, now=NOW) is None  # resolved
    for replay in (NOW - 10, NOW - 5):  # the open again; the resolution itself again
        problem = order.judge(KEY, _at(replay), signed=True, now=NOW)
        assert problem is not None
        assert problem.startswith(f"{NOT_NEWER}:")
    # Another (source, subject) has its own order; a newer post is taken.
    assert order.judge((SUBJECT, SUBJECT), _at(NOW - 10), signed=True, now=NOW) is None
    assert order.judge(KEY, _at(NOW - 1), signed=True, now=NOW) is None


def test_of_two_posts_in_the_same_millisecond_the_resolution_is_newer() -> None:
    order = WarroomOrder()
    assert order.judge(KEY, _at(NOW - 1), signed=True, now=NOW) is None
    assert order.judge(KEY, _at(NOW - 1), signed=True, now=NOW, resolved=True) is None
    replayed = order.judge(KEY, _at(NOW - 1), signed=True, now=NOW)
    assert str(replayed).startswith(NOT_NEWER)
    again = order.judge(KEY, _at(NOW - 1), signed=True, now=NOW, resolved=True)
    assert str(again).startswith(NOT_NEWER)


def test_a_post_whose_time_is_not_a_time_is_not_taken() -> None:
    order = WarroomOrder()
    assert str(order.judge(KEY, "yesterday", signed=True, now=NOW)).startswith(STALE)
    assert str(order.judge(KEY, "yesterday", signed=False, now=NOW)).startswith(NOT_NEWER)


def test_refresh_is_due_at_half_the_window() -> None:
    assert not refresh_due(100.0, 100.0 + 299.9, 600.0)
    assert refresh_due(100.0, 100.0 + 300.0, 600.0)


def test_apply_warroom_keeps_a_resolved_incident_resolved_against_a_replayed_open() -> None:
    incidents: dict[tuple[UUID, UUID], Incident] = {}
    order = WarroomOrder(window=600.0, skew=30.0)
    opened = _post(NOW - 20)
    assert isinstance(apply_warroom(incidents, opened, _topic(), order, now=NOW), Incident)
    assert KEY in incidents
    resolved = apply_warroom(incidents, _post(NOW - 10, resolved=True), _topic(), order, now=NOW)
    assert isinstance(resolved, Incident)
    assert KEY not in incidents
    # The clear (an empty retained message) carries no time: it only removes.
    clear = Inbound(topic=topics.warroom(SOURCE, SUBJECT), payload=b"", retain=True)
    assert apply_warroom(incidents, clear, _topic(), order, now=NOW) is None
    replayed = apply_warroom(incidents, opened, _topic(), order, now=NOW)
    assert isinstance(replayed, str)
    assert replayed.startswith(NOT_NEWER)
    assert incidents == {}
    # Older than the window: refused STALE, whatever came before.
    fresh_order = WarroomOrder(window=600.0, skew=30.0)
    late = apply_warroom(incidents, opened, _topic(), fresh_order, now=NOW + 700)
    assert isinstance(late, str)
    assert late.startswith(f"{STALE}:")
    assert incidents == {}


def test_a_refreshed_post_is_taken_but_not_news() -> None:
    incidents: dict[tuple[UUID, UUID], Incident] = {}
    order = WarroomOrder()
    first = apply_warroom(incidents, _post(NOW - 400), _topic(), order, now=NOW)
    again = apply_warroom(incidents, _post(NOW - 100), _topic(), order, now=NOW)
    changed = apply_warroom(incidents, _post(NOW - 50, text="worse"), _topic(), order, now=NOW)
    assert isinstance(first, Incident)
    assert not first.again
    assert isinstance(again, Incident)
    assert again.again
    assert isinstance(changed, Incident)
    assert not changed.again
    assert incidents[KEY] is changed


def test_the_observer_counts_replays_and_tells_no_one() -> None:
    observer = FleetObserver(signing=Signing(replay_window=6.0, clock_skew=1.0))
    seen: list[Incident] = []
    observer.on_incident = seen.append
    now = datetime.now(UTC).timestamp()
    observer.take(_post(now - 3))
    observer.take(_post(now - 2, resolved=True))
    observer.take(_post(now - 3))  # the open, replayed within the window
    observer.take(_post(now - 30))  # a captured post older than the window
    assert observer.incidents == {}
    assert [i.failure.resolved for i in seen] == [False, True]
    assert observer.replays == {NOT_NEWER: 1, STALE: 1}


def _topic() -> topics.WarroomTopic:
    topic = topics.parse_topic(topics.warroom(SOURCE, SUBJECT))
    assert isinstance(topic, topics.WarroomTopic)
    return topic
