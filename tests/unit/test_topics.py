"""Topics: every topic of the scheme builds and parses back; anything else is refused."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import TopicError
from vox_mqtt.protocol.topics import (
    PREFIX,
    WARROOM_FILTER,
    WARROOM_ID,
    InboxTopic,
    StatusTopic,
    WarroomTopic,
    inbox,
    inbox_filter,
    parse_topic,
    status,
    warroom,
    warroom_filter,
)

ROOT = UUID("e162d5c1-df06-45ae-be42-f38d234896e3")
COORDINATOR = UUID("ff74ba58-a83d-40b4-ba17-9f4a9e2c3ced")


def test_the_topics_are_spelled_as_designed() -> None:
    assert PREFIX == "vox"
    assert inbox(COORDINATOR, ROOT) == f"vox/{COORDINATOR}/inbox/{ROOT}"
    assert inbox_filter(COORDINATOR) == f"vox/{COORDINATOR}/inbox/+"
    assert status(ROOT) == f"vox/{ROOT}/status"
    assert warroom(COORDINATOR, ROOT) == f"vox/warroom/{COORDINATOR}/{ROOT}"
    assert warroom_filter() == WARROOM_FILTER == "vox/warroom/#"
    assert warroom_filter(COORDINATOR) == f"vox/warroom/{COORDINATOR}/+"


def test_every_topic_parses_back_to_what_built_it() -> None:
    assert parse_topic(inbox(COORDINATOR, ROOT)) == InboxTopic(target=COORDINATOR, source=ROOT)
    assert parse_topic(status(ROOT)) == StatusTopic(agent=ROOT)
    assert parse_topic(warroom(COORDINATOR, ROOT)) == WarroomTopic(source=COORDINATOR, subject=ROOT)


@settings(max_examples=100, deadline=None)
@given(st.uuids(), st.uuids())
def test_any_pair_of_ids_round_trips(first: UUID, second: UUID) -> None:
    for topic in (inbox(first, second), status(first), warroom(first, second)):
        parsed = parse_topic(topic)
        assert parsed.topic == topic
    assert parse_topic(inbox(first, second)) == InboxTopic(first, second)
    assert parse_topic(warroom(first, second)) == WarroomTopic(first, second)


def test_the_war_room_id_is_a_fixed_documented_uuid() -> None:
    assert UUID("00000000-0000-4000-8000-000000000911") == WARROOM_ID
    assert WARROOM_ID.version == 4


@pytest.mark.parametrize(
    "spelling",
    [
        str(ROOT).upper(),
        ROOT.hex,
        "{" + str(ROOT) + "}",
        "urn:uuid:" + str(ROOT),
        str(ROOT)[:-1],
        "root",
    ],
)
def test_only_the_canonical_lower_case_uuid_is_accepted(spelling: str) -> None:
    # The broker's ACL matches topic strings literally: another spelling is another topic.
    for topic in (
        f"vox/{spelling}/status",
        f"vox/{spelling}/inbox/{COORDINATOR}",
        f"vox/{COORDINATOR}/inbox/{spelling}",
        f"vox/warroom/{spelling}/{COORDINATOR}",
        f"vox/warroom/{COORDINATOR}/{spelling}",
    ):
        with pytest.raises(TopicError, match=r"is not a (canonical lower-case )?UUID"):
            parse_topic(topic)


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "vox",
        "vox/",
        "foo/bar",
        f"VOX/{ROOT}/status",
        f"/vox/{ROOT}/status",
        f"vox/{ROOT}/status/",
        f"vox/{ROOT}/status/extra",
        f"vox/{ROOT}/inbox",
        f"vox/{ROOT}/inbox/",
        f"vox/{ROOT}/inbox/{COORDINATOR}/extra",
        f"vox/{ROOT}/outbox/{COORDINATOR}",
        f"vox/warroom/{ROOT}",
        f"vox/warroom/{ROOT}/{COORDINATOR}/extra",
        "vox/+/status",
        f"vox/{ROOT}/inbox/+",
        "vox/warroom/#",
        "$SYS/broker/uptime",
        f"other/{ROOT}/status",
    ],
)
def test_foreign_topics_are_refused(topic: str) -> None:
    with pytest.raises(TopicError) as caught:
        parse_topic(topic)
    assert repr(topic) in str(caught.value)


def test_the_presence_topic_parses_as_a_status_topic_that_says_so() -> None:
    agent = uuid4()
    parsed = topics.parse_topic(f"vox/{agent}/presence")
    assert isinstance(parsed, topics.StatusTopic)
    assert (parsed.agent, parsed.presence, parsed.topic) == (agent, True, topics.presence(agent))
    status = topics.parse_topic(topics.status(agent))
    assert isinstance(status, topics.StatusTopic)
    assert not status.presence
    assert topics.LIVENESS_FILTERS == ("vox/+/status", "vox/+/presence")


def test_an_agent_reads_its_masters_presence_never_its_status() -> None:
    me, master, kids = uuid4(), uuid4(), sorted([uuid4(), uuid4()])
    wanted = topics.liveness_topics(me, master, reversed(kids), own=True)
    assert wanted == [
        topics.presence(master),
        *(t for kid in kids for t in (topics.status(kid), topics.presence(kid))),
        topics.status(me),
        topics.presence(me),
    ]
    assert topics.status(master) not in wanted
    assert topics.liveness_topics(me, None, [], own=False) == []


def test_statuses_asked_for_come_with_their_presences() -> None:
    agent = uuid4()
    assert topics.with_presences([topics.STATUS_FILTER, topics.WARROOM_FILTER]) == [
        topics.STATUS_FILTER,
        topics.WARROOM_FILTER,
        topics.PRESENCE_FILTER,
    ]
    assert topics.with_presences([topics.status(agent), topics.presence(agent)]) == [
        topics.status(agent),
        topics.presence(agent),
    ]


def test_an_id_remembered_from_one_topic_does_not_admit_another_spelling() -> None:
    # parse_topic remembers the ids it read (protocol/topics.py): by their exact text only.
    assert parse_topic(f"vox/{ROOT}/inbox/{COORDINATOR}") == InboxTopic(ROOT, COORDINATOR)
    for spelling in (str(ROOT).upper(), ROOT.hex):
        with pytest.raises(TopicError, match=r"is not a (canonical lower-case )?UUID"):
            parse_topic(f"vox/{spelling}/inbox/{COORDINATOR}")
    assert parse_topic(f"vox/{ROOT}/inbox/{COORDINATOR}") == InboxTopic(ROOT, COORDINATOR)


def test_an_inbox_topic_is_the_same_text_from_ids_or_their_strings() -> None:
    built = inbox(ROOT, COORDINATOR)
    assert built == inbox(str(ROOT), str(COORDINATOR)) == f"vox/{ROOT}/inbox/{COORDINATOR}"
    assert inbox(COORDINATOR, ROOT) == f"vox/{COORDINATOR}/inbox/{ROOT}"
