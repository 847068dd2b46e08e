"""What the session does with signatures: sign each publish and will, judge each delivery.

The decisions are protocol/signing.py's; this module only finds the `vox-sig` property in
what paho received and adds it to what paho sends (docs/security.md).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass, replace

from paho.mqtt.properties import Properties

from vox_mqtt.protocol.settings import Will
from vox_mqtt.protocol.signing import (
    SIG_KEY,
    Proof,
    Signing,
    SigningKey,
    bad_signature,
    payload_digest,
    prepare,
    sign,
    verified,
)
from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.publishprops import signature_of, with_user_property

__all__ = [
    "Presigned",
    "Unverified",
    "Verdict",
    "first_step",
    "judge",
    "last_step",
    "own_key_renewed",
    "presign",
    "signed_properties",
    "signed_will",
]

_LINK_PREFIX = "vox/link/"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a received message's signature says."""

    signature: str | None
    forgery: str | None  # why it may not be believed; None: it may
    digest: bytes
    unsigned: bool  # unsigned and let through ("accept" mode)


def signed_properties(
    signing: Signing | None,
    topic: str,
    payload: bytes,
    props: Properties,
    presigned: Presigned | None = None,
) -> Properties:
    """Return props with this identity's signature of (topic, payload), when it signs.

    A signature presigned with this very key over these bytes, and ready, is used as it is.
    """
    if signing is None or signing.key is None or signing.mode == "off":
        return props
    value = None
    if presigned is not None and presigned.key is signing.key and presigned.topic == topic:
        value = presigned.value if presigned.payload == payload else None
    if value is None:
        value = sign(topic, payload, signing.key)
    return with_user_property(props, SIG_KEY, value)


class Presigned:
    """A publish's signature, made on the signing thread while its sender's ledger commits.

    `value` is None until it is ready; whoever publishes then signs on the spot rather than
    wait (signed_properties).
    """

    __slots__ = ("key", "payload", "topic", "value")

    def __init__(self, topic: str, payload: bytes, key: SigningKey) -> None:
        self.topic, self.payload, self.key = topic, payload, key
        self.value: str | None = None


_jobs: queue.SimpleQueue[Presigned] | None = None
_jobs_lock = threading.Lock()


def presign(signing: Signing | None, topic: str, payload: bytes) -> Presigned | None:
    """Start signing (topic, payload) on the signing thread; None when this identity does not sign.

    libsodium runs there without the GIL (PyNaCl's cffi releases it), beside the event loop.
    """
    if signing is None or signing.key is None or signing.mode == "off":
        return None
    global _jobs
    if _jobs is None:
        with _jobs_lock:
            if _jobs is None:
                jobs: queue.SimpleQueue[Presigned] = queue.SimpleQueue()
                signer = threading.Thread(target=_sign_each, args=(jobs,), name="vox-sign")
                signer.daemon = True
                signer.start()
                _jobs = jobs
    job = Presigned(topic, payload, signing.key)
    _jobs.put(job)
    return job


def _sign_each(jobs: queue.SimpleQueue[Presigned]) -> None:
    while True:
        job = jobs.get()
        with contextlib.suppress(Exception):  # not ready: the publisher signs it itself
            job.value = sign(job.topic, job.payload, job.key)


def signed_will(signing: Signing | None, will: Will | None) -> Will | None:
    """Return the will with its signature: the broker may publish it long after."""
    if will is None or signing is None or signing.key is None or signing.mode == "off":
        return will
    value = sign(will.topic, will.payload, signing.key)
    return replace(will, user_properties=(*will.user_properties, (SIG_KEY, value)))


def own_key_renewed(old: Signing | None, new: Signing | None) -> bool:
    """Tell whether new signs with another own key than old (a rotation of this identity)."""
    return _own_kid(old) != _own_kid(new)


def _own_kid(signing: Signing | None) -> str | None:
    if signing is None or signing.key is None or not signing.signs:
        return None
    return signing.key.kid


def received_signature(raw: RawProperties | Properties | None) -> str | None:
    """Return the `vox-sig` of received properties, packed or decoded."""
    if raw is None:
        return None
    if isinstance(raw, RawProperties):
        return signature_of(raw.packed, SIG_KEY)
    pairs = getattr(raw, "UserProperty", None) or ()
    return next((value for key, value in reversed(pairs) if key == SIG_KEY), None)


def judge(
    signing: Signing, topic: str, payload: bytes, raw: RawProperties | Properties | None
) -> Verdict:
    """Return the verdict on one received message under signing's mode (not "off")."""
    step = first_step(signing, topic, payload, raw)
    if isinstance(step, Verdict):
        return step
    return last_step(step, verified(step.proof))


@dataclass(frozen=True, slots=True)
class Unverified:
    """A received message whose signature is ready to verify (`first_step`)."""

    value: str
    proof: Proof
    digest: bytes


def first_step(
    signing: Signing, topic: str, payload: bytes, raw: RawProperties | Properties | None
) -> Verdict | Unverified:
    """Return the verdict found without cryptography, or what is left to verify."""
    value = received_signature(raw)
    digest = payload_digest(payload)
    if value is None and signing.mode == "accept":
        return Verdict(None, None, digest, unsigned=not topic.startswith(_LINK_PREFIX))
    proof = prepare(topic, value, signing.keyring, digest)
    if proof is None or isinstance(proof, str):
        return Verdict(value, proof, digest, unsigned=False)
    assert value is not None  # prepare refuses a message without one
    return Unverified(value, proof, digest)


def last_step(unverified: Unverified, ok: bool) -> Verdict:
    """Return the verdict once the signature was verified (ok) or not."""
    forgery = None if ok else bad_signature(unverified.proof)
    return Verdict(unverified.value, forgery, unverified.digest, unsigned=False)
