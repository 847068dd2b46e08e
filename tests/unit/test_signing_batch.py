"""Signatures off the event loop's path: a batch verified on a worker thread, in order, and
a publish signed on the signing thread while its record commits."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from uuid import uuid4

from paho.mqtt.packettypes import PacketTypes

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.protocol.signing import (
    Keyring,
    Proof,
    SignedTopic,
    Signing,
    SigningKey,
    payload_digest,
    prepare,
    sign,
    verified,
)
from vox_mqtt.transport import received
from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.publishprops import signature_of, vox_properties, with_user_property
from vox_mqtt.transport.received import Inbound, verdicts, verify_all
from vox_mqtt.transport.session import Session
from vox_mqtt.transport.signing import Presigned, presign, signed_properties

SENDER, TARGET = uuid4(), uuid4()
KEY = SigningKey.generate()
TOPIC = topics.inbox(TARGET, SENDER)
RING = Keyring(current={SENDER: {KEY.kid: KEY.public}})
SIGNING = Signing(mode="require", key=KEY, keyring=RING)


def payload(n: int) -> bytes:
    return b'{"type":"command_request","n":%d}' % n


def props_of(value: str | None) -> RawProperties:
    """Return the properties of a publish as a session receives them: packed."""
    props = vox_properties(type="command_request", sender="a", packet=PacketTypes.PUBLISH)
    if value is not None:
        props = with_user_property(props, "vox-sig", value)
    return RawProperties(props.pack())  # type: ignore[no-untyped-call]


def proof_of(data: bytes) -> Proof:
    proof = prepare(TOPIC, sign(TOPIC, data, KEY), RING, payload_digest(data))
    assert isinstance(proof, Proof)
    return proof


def test_a_proof_verifies_and_any_changed_byte_is_refused() -> None:
    proof = proof_of(payload(1))
    assert verified(proof)
    for at in (0, 63, 64, len(proof.signed) - 1):  # the signature, then the signed bytes
        changed = bytearray(proof.signed)
        changed[at] ^= 0x01
        assert not verified(proof._replace(signed=bytes(changed)))
    other = SigningKey.generate()
    assert not verified(proof._replace(public=other.public))


def test_prepare_refuses_before_any_cryptography() -> None:
    digest = payload_digest(payload(1))
    assert prepare("vox/link/bridge-1", None, RING, digest) is None  # nobody signs it
    missing = prepare(TOPIC, None, RING, digest)
    assert isinstance(missing, str)
    assert missing.startswith("MISSING_SIGNATURE")
    stranger = SigningKey.generate()
    unknown = prepare(TOPIC, sign(TOPIC, payload(1), stranger), RING, digest)
    assert isinstance(unknown, str)
    assert unknown.startswith("UNKNOWN_KEY")


def test_the_worker_verifies_a_batch_in_order() -> None:
    good = [proof_of(payload(n)) for n in range(5)]
    bad = good[1]._replace(signed=good[1].signed[:-1] + b"\x00")
    assert verify_all([good[0], bad, *good[2:]]) == [True, False, True, True, True]


async def test_a_batch_keeps_its_order_and_refuses_the_bad_one_on_the_worker_thread() -> None:
    seen: list[str] = []
    real = received.verify_all

    def watched(proofs: list[Proof]) -> list[bool]:
        seen.append(threading.current_thread().name)
        return real(proofs)

    items = []
    for n in range(6):
        value = sign(TOPIC, payload(n), KEY)
        # The fourth's payload is changed after it was signed.
        items.append((TOPIC, payload(n) + (b" " if n == 3 else b""), props_of(value)))
    items.append((TOPIC, payload(9), props_of(None)))  # unsigned: refused, no verification
    received.verify_all = watched
    try:
        said = await verdicts(SIGNING, items)
        one = await verdicts(SIGNING, items[:1])
    finally:
        received.verify_all = real
    problems = [(v.forgery or "").partition(":")[0] for v in said]
    assert problems == ["", "", "", "BAD_SIGNATURE", "", "", "MISSING_SIGNATURE"]
    assert [v.digest for v in said] == [payload_digest(p) for _, p, _ in items]
    assert len(seen) == 1
    assert seen[0].startswith("vox-verify")
    assert one[0].forgery is None  # one message: on the loop, the worker not asked


async def test_the_session_yields_a_batch_judged_in_order() -> None:
    session = Session(BrokerSettings(client_id="unit", signing=SIGNING), subscriptions=[])
    for n in range(8):
        value = sign(TOPIC, payload(n), KEY)
        data = payload(n) + (b" " if n == 5 else b"")  # the sixth is forged
        inbound = Inbound(topic=TOPIC, payload=data, retain=False, raw_properties=props_of(value))
        session._queue.put_nowait(inbound)  # as paho's callback queues them (Session._offer)
    session._queue.put_nowait(None)  # the end
    got = [inbound async for inbound in session.messages()]
    assert [inbound.payload.rstrip() for inbound in got] == [payload(n) for n in range(8)]
    assert [inbound.forgery is not None for inbound in got] == [n == 5 for n in range(8)]
    assert all(isinstance(i.topic, SignedTopic) for n, i in enumerate(got) if n != 5)
    assert not isinstance(got[5].topic, SignedTopic)  # the ledger keeps no signature of it
    assert session.forged == 1


async def test_a_cancelled_reader_leaves_the_batch_to_the_next() -> None:
    session = Session(BrokerSettings(client_id="unit", signing=SIGNING), subscriptions=[])
    for n in range(4):
        value = sign(TOPIC, payload(n), KEY)
        session._queue.put_nowait(
            Inbound(topic=TOPIC, payload=payload(n), retain=False, raw_properties=props_of(value))
        )
    reader = session.messages()
    first = asyncio.ensure_future(anext(reader))
    await asyncio.sleep(0)  # the batch is taken and handed to the worker
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    session._queue.put_nowait(None)
    got = [inbound async for inbound in session.messages()]
    assert [inbound.payload for inbound in got] == [payload(n) for n in range(4)]
    assert all(inbound.forgery is None for inbound in got)


def test_a_presigned_signature_is_the_one_signed_on_the_spot() -> None:
    job = presign(SIGNING, TOPIC, payload(1))
    assert job is not None
    deadline = time.monotonic() + 10
    while job.value is None and time.monotonic() < deadline:
        time.sleep(0.001)  # made on the signing thread
    assert job.value == sign(TOPIC, payload(1), KEY)  # Ed25519 signatures are deterministic
    props = vox_properties(type="command_request", sender="a")
    used = signed_properties(SIGNING, TOPIC, payload(1), props, job)
    assert signature_of(used.pack(), "vox-sig") == job.value  # type: ignore[no-untyped-call]
    assert presign(Signing(mode="off", key=KEY, keyring=RING), TOPIC, payload(1)) is None


def test_a_presigned_signature_of_other_bytes_or_an_old_key_is_never_used() -> None:
    props = vox_properties(type="command_request", sender="a")
    job = presign(SIGNING, TOPIC, payload(1))
    assert job is not None
    job.value = "not-a-signature"  # as if ready: whatever it holds must not be sent
    for topic, data, signing in (
        (TOPIC, payload(2), SIGNING),  # other bytes
        (topics.inbox(uuid4(), SENDER), payload(1), SIGNING),  # another topic
        (TOPIC, payload(1), replace(SIGNING, key=SigningKey.generate())),  # a rotated key
    ):
        used = signed_properties(signing, topic, data, props, job)
        value = signature_of(used.pack(), "vox-sig")  # type: ignore[no-untyped-call]
        assert value == sign(topic, data, signing.key)  # type: ignore[arg-type]
    unready = Presigned(TOPIC, payload(1), KEY)  # not signed yet: signed on the spot
    used = signed_properties(SIGNING, TOPIC, payload(1), props, unready)
    assert signature_of(used.pack(), "vox-sig") == sign(TOPIC, payload(1), KEY)  # type: ignore[no-untyped-call]
