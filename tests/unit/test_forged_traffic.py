"""ForgedTraffic: when the FORGED_TRAFFIC incident is raised, and when a reload ends it."""

from __future__ import annotations

from uuid import uuid4

from vox_mqtt.agent.forgedtraffic import ForgedTraffic
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.signing import FORGERY_WINDOW

ME, PEER, OTHER = uuid4(), uuid4(), uuid4()
UNKNOWN = "UNKNOWN_KEY: the key 0123 is not one of its sender's"
BAD = "BAD_SIGNATURE: the signature does not verify"


def test_raised_once_per_window_then_again() -> None:
    forgery = ForgedTraffic()
    text = forgery.refused(topics.inbox(ME, PEER), BAD, now=100.0)
    assert text is not None
    assert text.startswith("refused a message whose signature failed")
    assert BAD in text
    assert forgery.refused(topics.inbox(ME, PEER), BAD, now=101.0) is None
    assert forgery.refused(topics.inbox(ME, PEER), BAD, now=100.0 + FORGERY_WINDOW) is not None


def test_a_rotation_reloaded_out_of_order_ends_the_incident_it_raised() -> None:
    forgery = ForgedTraffic()
    assert forgery.refused(topics.presence(PEER), UNKNOWN, now=1.0) is not None
    assert forgery.explained({OTHER}) is False  # someone else's rotation explains nothing
    assert forgery.explained({PEER}) is True
    # Ended: a forgery after it raises at once, not a window later.
    assert forgery.refused(topics.inbox(ME, OTHER), BAD, now=2.0) is not None


def test_any_other_refusal_keeps_it_open() -> None:
    forgery = ForgedTraffic()
    forgery.refused(topics.presence(PEER), UNKNOWN, now=1.0)
    forgery.refused(topics.inbox(ME, PEER), BAD, now=2.0)  # the same sender, a bad signature
    assert forgery.explained({PEER}) is False
    other = ForgedTraffic()
    other.refused(topics.presence(PEER), UNKNOWN, now=1.0)
    other.refused(topics.presence(OTHER), UNKNOWN, now=2.0)  # a second sender's unknown key
    assert other.explained({PEER}) is False
    assert other.explained({OTHER}) is True


def test_nothing_refused_nothing_to_end() -> None:
    assert ForgedTraffic().explained({PEER}) is False
