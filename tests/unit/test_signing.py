"""The signing rules: what a signature covers, each refusal and its reason, sealed notes."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import FleetError
from vox_mqtt.protocol.hierarchy import parse_fleet
from vox_mqtt.protocol.settings import Will
from vox_mqtt.protocol.signing import (
    REPLAY_WINDOW,
    Keyring,
    SealKey,
    Signing,
    SigningKey,
    carry_over,
    check,
    is_sealed,
    open_sealed,
    payload_digest,
    replay_problem,
    resend_until,
    seal,
    sender_of,
    sign,
    verify_digest,
)
from vox_mqtt.transport.inbound import carried
from vox_mqtt.transport.publishprops import (
    decode,
    signature_of,
    vox_properties,
    with_user_property,
)
from vox_mqtt.transport.signing import judge, own_key_renewed, received_signature, signed_will

SENDER, TARGET, OTHER = uuid4(), uuid4(), uuid4()
KEY = SigningKey.generate()
TOPIC = topics.inbox(TARGET, SENDER)
PAYLOAD = b'{"type":"command_request","details":{"command":"analyze"}}'
RING = Keyring(current={SENDER: {KEY.kid: KEY.public}})


def reason(problem: str | None) -> str | None:
    return None if problem is None else problem.partition(":")[0]


def test_a_signed_message_verifies() -> None:
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, KEY), RING) is None


def test_a_changed_payload_or_topic_is_a_bad_signature() -> None:
    value = sign(TOPIC, PAYLOAD, KEY)
    assert reason(check(TOPIC, PAYLOAD + b" ", value, RING)) == "BAD_SIGNATURE"
    moved = topics.inbox(OTHER, SENDER)  # another inbox, the same sender
    assert reason(check(moved, PAYLOAD, value, RING)) == "BAD_SIGNATURE"


def test_a_key_of_another_identity_is_unknown_for_this_sender() -> None:
    ring = Keyring(current={SENDER: {KEY.kid: KEY.public}, OTHER: {}})
    value = sign(topics.inbox(TARGET, OTHER), PAYLOAD, KEY)  # SENDER's key, OTHER's topic
    assert reason(check(topics.inbox(TARGET, OTHER), PAYLOAD, value, ring)) == "UNKNOWN_KEY"


def test_a_retired_key_is_refused_by_name() -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    ring = Keyring(current={SENDER: {new.kid: new.public}}, retired={old.kid: (SENDER, old.public)})
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring)) == "RETIRED_KEY"


def rotated_ring(old: SigningKey, older: SigningKey, new: SigningKey) -> Keyring:
    """A keyring of a verifier reloaded after SENDER's rotation from older to old to new."""
    retired = {older.kid: (SENDER, older.public), old.kid: (SENDER, old.public)}
    current = {SENDER: {new.kid: new.public}}
    return Keyring(current=current, retired=retired, outgoing={SENDER: old.kid})


def test_the_outgoing_key_is_believed_until_its_sender_signs_with_the_new_one() -> None:
    older, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    ring = rotated_ring(old, older, new)
    # Reloaded before its signer: the signer's messages under the key it still has are taken.
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring) is None
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring) is None
    # A key retired before it never is.
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, older), ring)) == "RETIRED_KEY"
    # A forgery under the outgoing key neither passes nor ends the grace.
    forged = sign(TOPIC, PAYLOAD, old)
    assert reason(check(TOPIC, PAYLOAD + b" ", forged, ring)) == "BAD_SIGNATURE"
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring) is None
    # Once the signer is seen with its new key, the old one is refused by name.
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, new), ring) is None
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring)) == "RETIRED_KEY"


def test_a_bad_signature_under_the_new_key_does_not_end_the_grace() -> None:
    older, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    ring = rotated_ring(old, older, new)
    forged = sign(TOPIC, PAYLOAD, new)
    assert reason(check(TOPIC, PAYLOAD + b" ", forged, ring)) == "BAD_SIGNATURE"
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), ring) is None
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, new), ring) is None


def test_a_reload_keeps_the_senders_already_seen_switched() -> None:
    older, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    before = rotated_ring(old, older, new)
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, new), before) is None
    after = rotated_ring(old, older, new)  # the same bundle, read again on a later SIGHUP
    carry_over(before, after)
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), after)) == "RETIRED_KEY"


def test_a_message_refused_before_the_reload_ends_the_grace_after_it() -> None:
    # The sender was reloaded first: its birth under the new key is refused here, unknown.
    older, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    before = Keyring(
        current={SENDER: {old.kid: old.public}}, retired={older.kid: (SENDER, older.public)}
    )
    birth = topics.status(SENDER)
    assert reason(check(birth, PAYLOAD, sign(birth, PAYLOAD, new), before)) == "UNKNOWN_KEY"
    after = rotated_ring(old, older, new)
    assert carry_over(before, after) == {SENDER}  # a rotation out of order, not a forgery
    # That birth verifies under the new keys: the old key gets no grace.
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), after)) == "RETIRED_KEY"


def test_a_forgery_refused_before_the_reload_does_not_end_the_grace() -> None:
    older, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    stranger = SigningKey.generate()
    before = Keyring(current={SENDER: {old.kid: old.public}})
    forged = sign(TOPIC, PAYLOAD, stranger)
    assert reason(check(TOPIC, PAYLOAD, forged, before)) == "UNKNOWN_KEY"
    # Even under the new key's id, a signature the new key did not make proves nothing.
    under_new_id = f"{new.kid}.{forged.partition('.')[2]}"
    assert reason(check(TOPIC, PAYLOAD + b" ", under_new_id, before)) == "UNKNOWN_KEY"
    after = rotated_ring(old, older, new)
    assert carry_over(before, after) == set()
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), after) is None


def test_a_second_rotation_opens_the_grace_for_the_key_it_retires() -> None:
    oldest, older, old, new = (SigningKey.generate() for _ in range(4))
    before = rotated_ring(older, oldest, old)
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), before) is None  # switched
    after = rotated_ring(old, older, new)  # rotated again: `old` is the outgoing key now
    carry_over(before, after)
    assert check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old), after) is None
    assert reason(check(TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, older), after)) == "RETIRED_KEY"


def test_an_unknown_sender_leaves_nothing_to_carry_over() -> None:
    ring = Keyring(current={SENDER: {KEY.kid: KEY.public}})
    stranger = uuid4()
    topic = topics.inbox(TARGET, stranger)
    assert reason(check(topic, PAYLOAD, sign(topic, PAYLOAD, KEY), ring)) == "UNKNOWN_KEY"
    assert ring.unverified == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "MISSING_SIGNATURE"),
        ("", "MALFORMED_SIGNATURE"),
        ("nodot", "MALFORMED_SIGNATURE"),
        (f"{KEY.kid}.{'!' * 86}", "MALFORMED_SIGNATURE"),
        (f"{KEY.kid}.{'A' * 86}", "BAD_SIGNATURE"),
        (f"{'0' * 16}.{'A' * 86}", "UNKNOWN_KEY"),
    ],
)
def test_each_malformed_signature_has_its_reason(value: str | None, expected: str) -> None:
    assert reason(check(TOPIC, PAYLOAD, value, RING)) == expected


def test_the_signer_is_the_sender_the_topic_names() -> None:
    assert sender_of(topics.inbox(TARGET, SENDER)) == SENDER
    assert sender_of(topics.status(SENDER)) == SENDER
    assert sender_of(topics.warroom(SENDER, OTHER)) == SENDER
    assert sender_of("vox/not-a-topic") is None
    value = sign("vox/x/y/z/w", PAYLOAD, KEY)
    assert reason(check("vox/x/y/z/w", PAYLOAD, value, RING)) == "UNKNOWN_SENDER"


def test_a_bridge_state_is_not_judged() -> None:
    assert check(f"vox/link/{uuid4()}", b"1", None, RING) is None


def test_a_ledger_row_verifies_from_its_digest_alone() -> None:
    value = sign(TOPIC, PAYLOAD, KEY)
    assert verify_digest(TOPIC, payload_digest(PAYLOAD), value, KEY.public)
    assert not verify_digest(TOPIC, payload_digest(b"other"), value, KEY.public)
    assert not verify_digest(TOPIC, payload_digest(PAYLOAD), "junk", KEY.public)


def test_a_sealed_note_opens_only_with_its_key() -> None:
    operator = SealKey.generate()
    sealed = seal("call the client about the contract", operator.public)
    assert is_sealed(sealed)
    assert "contract" not in sealed
    assert open_sealed(sealed, operator) == "call the client about the contract"
    with pytest.raises(ValueError, match="does not open"):
        open_sealed(sealed, SealKey.generate())
    with pytest.raises(ValueError, match="not a sealed note"):
        open_sealed("plain text", operator)


def test_the_signature_is_appended_as_the_last_user_property() -> None:
    props = vox_properties(type="command_request", sender="a", target="b", expiry=30)
    value = sign(TOPIC, PAYLOAD, KEY)
    signed = with_user_property(props, "vox-sig", value)
    decoded = decode(signed.packed)
    assert decoded.user_properties[-1] == ("vox-sig", value)
    assert decoded.message_expiry_interval == 30
    assert signature_of(signed.packed, "vox-sig") == value
    # As Inbound carries them: packed as received, or decoded, under our names.
    assert received_signature(signed.packed) == value
    assert received_signature(carried(decoded)) == value
    assert signature_of(props.packed, "vox-sig") is None


def test_the_modes() -> None:
    unsigned = judge(Signing(mode="accept", keyring=RING), TOPIC, PAYLOAD, None)
    assert unsigned.forgery is None
    assert unsigned.unsigned
    required = judge(Signing(mode="require", keyring=RING), TOPIC, PAYLOAD, None)
    assert reason(required.forgery) == "MISSING_SIGNATURE"
    props = with_user_property(
        vox_properties(type="t", sender="a"), "vox-sig", sign(TOPIC, b"x", KEY)
    )
    for received in (props.packed, carried(decode(props.packed))):
        bad = judge(Signing(mode="accept", keyring=RING), TOPIC, PAYLOAD, received)
        assert reason(bad.forgery) == "BAD_SIGNATURE"  # "accept" verifies what is signed


def test_the_will_is_signed_for_its_own_topic_and_payload() -> None:
    will = Will(topic=topics.status(SENDER), payload=b'{"status":"INACTIVE"}')
    signed = signed_will(Signing(mode="require", key=KEY), will)
    assert signed is not None
    value = dict(signed.user_properties)["vox-sig"]
    assert (
        check(will.topic, will.payload, value, Keyring(current={SENDER: {KEY.kid: KEY.public}}))
        is None
    )
    assert signed_will(Signing(mode="off", key=KEY), will) is will


def _row(row_id: int, topic: str, payload: bytes, value: str | None) -> dict[str, object]:
    details: dict[str, object] = {"topic": topic}
    if value is not None:
        details |= {"signature": value, "payload_sha256": payload_digest(payload).hex()}
    return {"id": row_id, "action": "received", "details": details}


def test_a_ledger_proves_who_sent_each_message_it_recorded() -> None:
    from vox_mqtt.ledger.signatures import check_signatures

    old = SigningKey.generate()
    ring = Keyring(current=RING.current, retired={old.kid: (SENDER, old.public)})
    forged = _row(4, TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, KEY))
    forged["details"]["payload_sha256"] = payload_digest(b"other").hex()  # type: ignore[index]
    other = topics.inbox(TARGET, OTHER)
    rows = [
        _row(1, TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, KEY)),
        _row(2, TOPIC, PAYLOAD, sign(TOPIC, PAYLOAD, old)),  # before a rotation: still proof
        _row(3, TOPIC, PAYLOAD, None),
        forged,
        _row(5, other, PAYLOAD, sign(other, PAYLOAD, KEY)),  # SENDER's key on OTHER's topic
        {"id": 6, "action": "sent", "details": {}},
    ]
    report = check_signatures(rows, ring)
    assert (report.verified, report.unsigned) == (2, 1)
    assert [row for row, _ in report.problems] == [4, 5]
    assert "does not verify" in report.problems[0][1]
    assert f"not by {OTHER}" in report.problems[1][1]


def test_the_fleet_file_names_the_mode() -> None:
    from vox_mqtt.protocol.errors import FleetError
    from vox_mqtt.protocol.hierarchy import parse_fleet, seed_fleet_toml

    assert parse_fleet(seed_fleet_toml()).signatures == "require"  # what `vox init` writes
    older = seed_fleet_toml().replace('signatures = "require"\n', "")
    assert parse_fleet(older).signatures == "off"  # a fleet file from before signatures
    with pytest.raises(FleetError) as refused:
        parse_fleet('signatures = "yes"\n' + older)
    assert refused.value.problems == [
        'fleet.toml: signatures = \'yes\': must be "require", "accept" or "off"'
    ]


def test_forged_traffic_is_told_once_per_window() -> None:
    from vox_mqtt.protocol.signing import FORGERY_WINDOW, incident_due

    assert incident_due(None, 100.0)
    assert not incident_due(100.0, 100.0 + FORGERY_WINDOW - 1)
    assert incident_due(100.0, 100.0 + FORGERY_WINDOW)


NOW = 1_800_000_000.0


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (0.0, None),
        (599.0, None),
        (629.0, None),  # within the window and the skew allowed
        (631.0, "STALE"),  # older than both
        (-29.0, None),  # a clock a little ahead
        (-31.0, "STALE"),  # too far ahead
    ],
)
def test_a_signed_message_outside_the_replay_window_is_stale(
    age: float, expected: str | None
) -> None:
    assert reason(replay_problem(iso(NOW - age), NOW, 600.0, 30.0)) == expected


def test_a_stale_problem_says_its_age_and_the_window() -> None:
    problem = replay_problem(iso(NOW - 700), NOW, 600.0, 30.0)
    assert problem == (
        "STALE: emitted 700 s ago, older than the replay window (600 s, 30 s of clock skew allowed)"
    )
    assert reason(replay_problem("yesterday", NOW, 600.0, 30.0)) == "STALE"


def test_the_sender_stops_at_the_window_before_its_receiver_refuses() -> None:
    # Every re-send the sender still makes is taken by a receiver whose clock agrees within
    # the skew: the two rules never leave a genuine message refused and not ended.
    for window in (5.0, 600.0):
        emitted = iso(NOW)
        until = resend_until(emitted, window)
        assert until == pytest.approx(NOW + window)
        for skew in (0.0, 30.0):
            for clock_error in (-skew, 0.0, skew):
                assert replay_problem(emitted, until - 0.001 + clock_error, window, skew) is None
    assert resend_until("not a time", 600.0) == -math.inf


def test_the_fleet_file_names_the_replay_window() -> None:
    base = f'[operator]\nid = "{uuid4()}"\n[[agents]]\nname = "root"\nid = "{uuid4()}"\n'
    assert parse_fleet(base).replay_window == REPLAY_WINDOW == 600.0
    assert parse_fleet("replay_window = 30\n" + base).replay_window == 30.0
    for bad in ("0", "-1", '"600"', "true", "100000"):
        with pytest.raises(FleetError, match="replay_window"):
            parse_fleet(f"replay_window = {bad}\n" + base)


def test_only_a_new_own_key_renews_the_will() -> None:
    other = SigningKey.generate()
    mine = Signing(mode="require", key=KEY, keyring=RING)
    assert not own_key_renewed(mine, Signing(mode="require", key=KEY))  # new peers' keys only
    assert own_key_renewed(mine, Signing(mode="require", key=other))
    assert own_key_renewed(None, mine)  # signing starts
    assert own_key_renewed(mine, Signing(mode="off", key=KEY))  # signing stops
    assert not own_key_renewed(Signing(key=None, keyring=RING, mode="require"), None)
