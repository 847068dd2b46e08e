"""The transport's word for what became of a publish (vox_mqtt/transport/outcome.py)."""

from __future__ import annotations

from vox_mqtt.protocol.errors import DeliveryFailed
from vox_mqtt.transport.outcome import CONNECTION_LOST, PublishOutcome, answered


def test_success_codes_are_accepted_and_nothing_else() -> None:
    for code, reason in ((0x00, "Success"), (0x10, "No matching subscribers")):
        outcome = answered(code, reason)
        assert (outcome.accepted, outcome.refused, outcome.lost) == (True, False, False)


def test_a_code_from_0x80_is_a_refusal_with_a_reason_a_person_can_act_on() -> None:
    outcome = answered(0x87, "Not authorized")
    assert (outcome.accepted, outcome.refused, outcome.lost) == (False, True, False)
    error = outcome.error("vox/a/inbox/b")
    assert isinstance(error, DeliveryFailed)
    assert error.reason_code == 0x87
    assert "refused the message on 'vox/a/inbox/b': Not authorized (0x87)" in str(error)
    assert "ACL" in str(error)
    assert "ACL" not in str(answered(0x97, "Quota exceeded").error("t"))


def test_a_lost_connection_is_neither_accepted_nor_refused() -> None:
    assert (CONNECTION_LOST.accepted, CONNECTION_LOST.refused, CONNECTION_LOST.lost) == (
        False,
        False,
        True,
    )
    assert "may or may not have been delivered" in str(CONNECTION_LOST.error("t"))
    assert CONNECTION_LOST.error("t").reason_code is None


def test_one_shared_value_per_answer() -> None:
    assert answered(0, "Success") is answered(0, "Success")
    assert answered(0, "Success") == PublishOutcome(0, "Success")
