"""The one intake of statuses and war-room posts (observe/statusintake.py): what a look and an
agent's watch of its children both take through it (docs/liveness.md, docs/security.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from vox_mqtt.observe.status import ACTIVE, FleetView
from vox_mqtt.observe.statusbounds import Timeliness
from vox_mqtt.observe.statusintake import Refusal, StatusIntake, timeliness
from vox_mqtt.observe.warroomreplay import NOT_NEWER
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize
from vox_mqtt.protocol.signing import STALE, SignedTopic, Signing, payload_digest
from vox_mqtt.transport.session import Inbound

ME, CHILD, STRANGER = uuid4(), uuid4(), uuid4()


def _status(agent: UUID, *, epoch: int = 1, presence: bool = False) -> Inbound:
    report = AgentStatus(
        name="spec",
        status="ACTIVE" if presence else None,
        epoch=epoch,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        commands=[] if presence else ["analyze"],
        sequence=1,
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=agent, details=report)
    topic = topics.presence(agent) if presence else topics.status(agent)
    return Inbound(topic=topic, payload=serialize(message), retain=False)


def _post(source: UUID, subject: UUID, at: float) -> Inbound:
    failure = SystemFailure(
        error_code="VM_CONNECTION_LOST", severity="CRITICAL", description="lost", subject=subject
    )
    emitted = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    message = new_message(
        MSG_SYSTEM_FAILURE, source=source, target=topics.WARROOM_ID, details=failure
    ).model_copy(update={"emitted_at": emitted})
    payload = serialize(message)
    topic = SignedTopic.of(topics.warroom(source, subject), "kid.sig", payload_digest(payload))
    return Inbound(topic=topic, payload=payload, retain=True)


def _intake(**kw: object) -> tuple[StatusIntake, list[Refusal]]:
    intake = StatusIntake(FleetView(), **kw)  # type: ignore[arg-type]
    refused: list[Refusal] = []
    intake.on_refused = refused.append
    return intake, refused


def test_a_status_goes_into_the_view_and_comes_back() -> None:
    intake, refused = _intake()
    taken = intake.take(_status(CHILD, presence=True))
    assert taken is not None
    assert taken.source == CHILD
    entry = intake.view.get(CHILD)
    assert entry is not None
    assert entry.status == ACTIVE
    assert (intake.messages, refused) == (1, [])


def test_the_reader_s_own_status_comes_back_and_stays_out_of_the_view() -> None:
    intake, _ = _intake(own=ME)
    taken = intake.take(_status(ME, presence=True))
    assert taken is not None
    assert taken.source == ME
    assert intake.view.get(ME) is None


def test_a_status_claiming_another_source_is_not_taken() -> None:
    intake, _ = _intake()
    claimed = _status(STRANGER)
    inbound = Inbound(topic=topics.status(CHILD), payload=claimed.payload, retain=False)
    assert intake.take(inbound) is None
    assert intake.view.get(CHILD) is None
    assert intake.view.get(STRANGER) is None


def test_a_forged_delivery_is_refused_at_the_door_and_counted() -> None:
    intake, refused = _intake()
    status = _status(CHILD)
    forged = Inbound(
        topic=status.topic, payload=status.payload, retain=False, forgery="BAD_SIGNATURE: no"
    )
    assert intake.take(forged) is None
    assert intake.view.get(CHILD) is None
    assert intake.forged == 1
    assert intake.messages == 0
    assert [(r.kind, r.reason) for r in refused] == [("forged", "BAD_SIGNATURE")]


def test_a_topic_outside_the_scheme_is_not_counted() -> None:
    intake, refused = _intake()
    assert intake.take(Inbound(topic="elsewhere/x/y", payload=b"{}", retain=False)) is None
    assert (intake.messages, refused) == (0, [])


def test_replayed_posts_are_counted_by_reason_and_told() -> None:
    intake, refused = _intake(signing=lambda: Signing(replay_window=6.0, clock_skew=1.0))
    news: list[object] = []
    intake.on_incident = news.append
    now = datetime.now(UTC).timestamp()
    assert intake.take(_post(CHILD, CHILD, now - 2)) is None
    intake.take(_post(CHILD, CHILD, now - 3))  # not newer than the one taken
    intake.take(_post(CHILD, STRANGER, now - 30))  # older than the window
    assert len(news) == 1
    assert len(intake.incidents) == 1
    assert intake.replays == {NOT_NEWER: 1, STALE: 1}
    assert [(r.kind, r.reason) for r in refused] == [("replayed", NOT_NEWER), ("replayed", STALE)]


def test_a_post_against_the_rule_is_dropped_for_an_agent_that_knows_the_masters() -> None:
    # A post about an agent by someone who is neither it nor its master (docs/security.md).
    intake, refused = _intake(master_of=lambda agent: ME if agent == CHILD else None)
    now = datetime.now(UTC).timestamp()
    intake.take(_post(STRANGER, CHILD, now))
    assert intake.incidents == {}
    assert [r.kind for r in refused] == ["dropped"]
    intake.take(_post(ME, CHILD, now))
    assert list(intake.incidents) == [(ME, CHILD)]


def test_the_window_follows_the_signing_as_it_stands() -> None:
    signing = [Signing(mode="accept", replay_window=6.0, clock_skew=1.0)]
    intake, _ = _intake(signing=lambda: signing[0])
    assert intake.view.timeliness == Timeliness(window=6.0, skew=1.0)
    signing[0] = Signing(mode="accept", replay_window=60.0, clock_skew=2.0)  # a reload
    intake.take(_status(CHILD))
    assert intake.view.timeliness == Timeliness(window=60.0, skew=2.0)


def test_statuses_are_dated_by_their_signed_time_only_where_signatures_are_on() -> None:
    assert timeliness(None) is None
    assert timeliness(Signing(mode="off")) is None
    on = Signing(mode="require", replay_window=30.0, clock_skew=5.0)
    assert timeliness(on) == Timeliness(window=30.0, skew=5.0)
