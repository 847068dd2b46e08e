"""Signed VOX publishes and sealed notes: pure functions over keys (docs/security.md).

Every VOX publish carries one MQTT v5 user property, `vox-sig` = `<key id>.<signature>`: an
Ed25519 signature over the topic, the SHA-256 of the exact payload bytes and the key id, so
a message cannot be moved to another topic, changed, or credited to another key. Who must
have signed is read from the topic itself: an inbox topic names its sender, a status topic
its agent, a war-room topic its source. `check` returns the problem with a message (its
reason first, e.g. `BAD_SIGNATURE: ...`) or None; nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal
from uuid import UUID

import nacl.bindings
import nacl.exceptions
import nacl.public
import nacl.signing

from vox_mqtt.protocol.errors import TopicError
from vox_mqtt.protocol.messages import parse_timestamp
from vox_mqtt.protocol.topics import PREFIX, InboxTopic, StatusTopic, parse_topic

__all__ = [
    "BAD_SIGNATURE",
    "CLOCK_SKEW",
    "FORGED_TRAFFIC",
    "FORGERY_WINDOW",
    "MALFORMED_SIGNATURE",
    "MISSING_SIGNATURE",
    "MODES",
    "REPLAY_WINDOW",
    "RETIRED_KEY",
    "SIG_KEY",
    "STALE",
    "UNKNOWN_KEY",
    "UNKNOWN_SENDER",
    "Keyring",
    "Mode",
    "SealKey",
    "SignedTopic",
    "Signing",
    "SigningKey",
    "carry_over",
    "check",
    "incident_due",
    "is_sealed",
    "key_id",
    "open_sealed",
    "payload_digest",
    "replay_problem",
    "resend_until",
    "seal",
    "seal_note",
    "sender_of",
    "sign",
    "signed_bytes",
    "verify_digest",
]

Mode = Literal["require", "accept", "off"]
MODES: Final[tuple[Mode, ...]] = ("require", "accept", "off")
SIG_KEY: Final = "vox-sig"  # the user property that carries the signature
_DOMAIN: Final = b"vox-sig/1\x00"
_SIG_BYTES: Final = 64
_SIG_CHARS: Final = 86  # its base64url form, unpadded
_TO_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE: Final = bytes.maketrans(b"-_", b"+/")
_KID_CHARS: Final = 16
# Reasons a message is refused, first word of the problem (recorded and counted as such).
MISSING_SIGNATURE: Final = "MISSING_SIGNATURE"
MALFORMED_SIGNATURE: Final = "MALFORMED_SIGNATURE"
UNKNOWN_KEY: Final = "UNKNOWN_KEY"
RETIRED_KEY: Final = "RETIRED_KEY"
BAD_SIGNATURE: Final = "BAD_SIGNATURE"
UNKNOWN_SENDER: Final = "UNKNOWN_SENDER"
# A signed inbox message emitted longer ago than the replay window (or further ahead than
# the clock skew allowed) is refused as STALE; its sender stops re-sending it at the window
# itself, so a genuine one is ended at its sender, never refused silently (docs/security.md).
STALE: Final = "STALE"
REPLAY_WINDOW: Final = 600.0  # the ledger's dedupe horizon (ledger/_index.py, docs/ledger.md)
CLOCK_SKEW: Final = 30.0
SEALED_PREFIX: Final = "vox-sealed:1:"
# The war-room cause an agent raises when traffic on its topics fails its signature, at most
# once per window (its open incident stands for the rest: docs/security.md).
FORGED_TRAFFIC: Final = "FORGED_TRAFFIC"
FORGERY_WINDOW: Final = 600.0
_LINK_PREFIX: Final = f"{PREFIX}/link/"


def key_id(public: bytes) -> str:
    """Return the id of a public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public).hexdigest()[:_KID_CHARS]


@dataclass(frozen=True)
class SigningKey:
    """One identity's Ed25519 private key (its 32-byte seed) and what derives from it."""

    seed: bytes = field(repr=False)
    public: bytes = field(init=False)
    kid: str = field(init=False)
    _secret: bytes = field(init=False, repr=False)  # libsodium's 64-byte form, made once

    def __post_init__(self) -> None:
        if len(self.seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, not {len(self.seed)}")
        public, secret = nacl.bindings.crypto_sign_seed_keypair(self.seed)
        object.__setattr__(self, "public", public)
        object.__setattr__(self, "kid", key_id(public))
        object.__setattr__(self, "_secret", secret)

    @classmethod
    def generate(cls) -> SigningKey:
        """Return a fresh random key."""
        return cls(bytes(nacl.signing.SigningKey.generate()))

    def sign_raw(self, data: bytes) -> bytes:
        """Return the 64-byte signature of data."""
        return nacl.bindings.crypto_sign(data, self._secret)[:_SIG_BYTES]


@dataclass(frozen=True)
class SealKey:
    """The operator's X25519 key pair: agents seal note_to_human to its public half."""

    private: bytes = field(repr=False)
    public: bytes = field(init=False)

    def __post_init__(self) -> None:
        if len(self.private) != 32:
            raise ValueError(f"an X25519 private key is 32 bytes, not {len(self.private)}")
        public = bytes(nacl.public.PrivateKey(self.private).public_key)
        object.__setattr__(self, "public", public)

    @classmethod
    def generate(cls) -> SealKey:
        """Return a fresh random key pair."""
        return cls(bytes(nacl.public.PrivateKey.generate()))


@dataclass(frozen=True)
class Keyring:
    """The public keys one identity trusts: current ones per sender, retired ones by id."""

    current: Mapping[UUID, Mapping[str, bytes]] = field(default_factory=dict)  # kid -> key
    retired: Mapping[str, tuple[UUID, bytes]] = field(default_factory=dict)  # kid -> owner, key
    # Each sender's newest retired key, still believed until that sender is first seen
    # signing with a current key: the daemons of a rotation are reloaded one after another,
    # and a verifier reloaded first would refuse every message of a signer not reloaded yet
    # (docs/security.md, rotation). The one state of a keyring: the senders seen switched.
    outgoing: Mapping[UUID, str] = field(default_factory=dict)  # sender -> kid
    switched: set[UUID] = field(default_factory=set, compare=False)
    # The last message of each known sender refused UNKNOWN_KEY: (topic, digest, signature).
    # A sender reloaded with a new key before this verifier signs with a key it cannot know
    # yet; once this verifier is reloaded, that message shows the sender switched
    # (carry_over), so the outgoing key's grace does not open again for it.
    unverified: dict[UUID, tuple[str, bytes, str]] = field(default_factory=dict, compare=False)

    def public(self, kid: str) -> tuple[UUID, bytes] | None:
        """Return (owner, public key) of a current or retired key id; None if unknown."""
        for owner, keys in self.current.items():
            if kid in keys:
                return owner, keys[kid]
        return self.retired.get(kid)


@dataclass(frozen=True, kw_only=True)
class Signing:
    """What one identity signs with, whom it believes, and in which mode (docs/security.md)."""

    mode: Mode = "off"
    key: SigningKey | None = None  # None: verifies only (the read-only explorer)
    keyring: Keyring = field(default_factory=Keyring)
    seal_to: bytes | None = None  # the operator's X25519 public key: note_to_human is sealed
    seal_key: SealKey | None = None  # the operator's own key pair, to open the notes
    replay_window: float = REPLAY_WINDOW  # seconds a signed message may be taken after its emission
    clock_skew: float = CLOCK_SKEW  # how far hosts' clocks may disagree, on top of it
    # Each peer's name and, where the bundle says, its master: what a view shows of an
    # agent, never what its status claims (docs/security.md, F26).
    roster: Mapping[UUID, tuple[str | None, UUID | None]] = field(default_factory=dict)

    @property
    def signs(self) -> bool:
        """Return whether this identity signs its publishes."""
        return self.key is not None and self.mode != "off"


class SignedTopic(str):
    """A received topic that also carries its message's verified signature and payload digest.

    The session hands it on as the Inbound's topic, so the ledger keeps what proves who sent
    each message it records (docs/ledger.md) without another argument on the way.
    """

    signature: str
    digest: str  # the payload's SHA-256, hex

    @classmethod
    def of(cls, topic: str, signature: str, digest: bytes) -> SignedTopic:
        """Return topic carrying signature and the payload's digest."""
        signed = cls(topic)
        signed.signature = signature
        signed.digest = digest.hex()
        return signed


def payload_digest(payload: bytes) -> bytes:
    """Return the SHA-256 of a payload: what the signature covers of it."""
    return hashlib.sha256(payload).digest()


def signed_bytes(topic: str, digest: bytes, kid: str) -> bytes:
    """Return what is signed: the domain, the key id, the topic (length first), the digest."""
    encoded = topic.encode()
    return b"".join(
        (_DOMAIN, kid.encode(), b"\x00", len(encoded).to_bytes(2, "big"), encoded, digest)
    )


def sign(topic: str, payload: bytes, key: SigningKey) -> str:
    """Return the `vox-sig` value of one publish: `<key id>.<base64url signature>`."""
    signature = key.sign_raw(signed_bytes(topic, hashlib.sha256(payload).digest(), key.kid))
    # base64url without its padding: the 86 characters of 64 bytes (binascii, not base64's
    # wrappers, which cost as much again on every publish).
    encoded = binascii.b2a_base64(signature, newline=False).translate(_TO_URLSAFE)
    return f"{key.kid}.{encoded[:_SIG_CHARS].decode()}"


@functools.lru_cache(maxsize=4096)
def sender_of(topic: str) -> UUID | None:
    """Return who must have signed a message on topic; None for a topic that names none.

    Kept per topic (an agent hears a handful: its peers' inboxes, statuses, posts): the
    parse is a tenth of a verification otherwise.
    """
    try:
        parsed = parse_topic(topic)
    except TopicError:
        return None
    if isinstance(parsed, InboxTopic):
        return parsed.source
    if isinstance(parsed, StatusTopic):
        return parsed.agent
    return parsed.source  # a war-room post: vox/warroom/<source>/<subject>


def _split(value: str) -> tuple[str, bytes] | None:
    kid, dot, text = value.partition(".")
    if not dot or len(kid) != _KID_CHARS or len(text) != _SIG_CHARS:
        return None
    try:  # what base64.urlsafe_b64decode does, without its wrappers
        signature = binascii.a2b_base64(text.encode("ascii").translate(_FROM_URLSAFE) + b"==")
    except (binascii.Error, ValueError):
        return None
    return (kid, signature) if len(signature) == _SIG_BYTES else None


def verify_digest(topic: str, digest: bytes, value: str, public: bytes) -> bool:
    """Return whether value is a valid signature of (topic, digest) by public."""
    parts = _split(value)
    if parts is None:
        return False
    kid, signature = parts
    try:
        nacl.bindings.crypto_sign_open(signature + signed_bytes(topic, digest, kid), public)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        return False
    return True


def check(
    topic: str, payload: bytes, value: str | None, keyring: Keyring, *, digest: bytes | None = None
) -> str | None:
    """Return why a received message may not be believed (reason first), or None.

    The signer must be the sender the topic names, with one of its current keys; a retired
    key, a key of another identity, a changed topic or payload are each refused.
    """
    if topic.startswith(_LINK_PREFIX):
        return None  # a bridge's state, written by the broker itself (docs/security.md)
    if value is None:
        return f"{MISSING_SIGNATURE}: the message on {topic} is not signed"
    parts = _split(value)
    if parts is None:
        return f"{MALFORMED_SIGNATURE}: the {SIG_KEY} property on {topic} is not <key id>.<sig>"
    kid, signature = parts
    sender = sender_of(topic)
    if sender is None:
        return f"{UNKNOWN_SENDER}: {topic} names no sender whose key could sign it"
    public = keyring.current.get(sender, {}).get(kid)
    outgoing = public is None and keyring.outgoing.get(sender) == kid
    if outgoing and sender not in keyring.switched:
        public = keyring.retired[kid][1]
    if public is None:
        retired = keyring.retired.get(kid)
        if retired is not None and retired[0] == sender:
            return f"{RETIRED_KEY}: key {kid} of {sender} was retired"
        if sender in keyring.current:  # one kept per known sender, for carry_over
            keyring.unverified[sender] = (topic, digest or payload_digest(payload), value)
        return f"{UNKNOWN_KEY}: key {kid} is not a key of {sender}"
    if digest is None:
        digest = payload_digest(payload)
    encoded = topic.encode()
    # libsodium's signed message: the signature, then signed_bytes(topic, digest, kid).
    signed = (signature, _DOMAIN, kid.encode(), b"\x00", len(encoded).to_bytes(2, "big"))
    try:
        nacl.bindings.crypto_sign_open(b"".join((*signed, encoded, digest)), public)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        return f"{BAD_SIGNATURE}: the signature of {sender} does not match this topic and payload"
    if not outgoing and sender in keyring.outgoing:
        keyring.switched.add(sender)  # from now on its retired key is refused
    return None


def carry_over(old: Keyring, new: Keyring) -> set[UUID]:
    """Tell a reloaded keyring which senders its predecessor saw switched to a new key.

    Without it every reload would open the outgoing key's grace again (docs/security.md,
    rotation): a sender stays switched while its outgoing key is the same, and a sender
    whose message the old keyring refused as UNKNOWN_KEY is switched if that message
    verifies under the new keyring's current keys (it was reloaded first). Return those
    senders: their refusal was a rotation reloaded out of order, not a forgery.
    """
    explained: set[UUID] = set()
    for sender, kid in new.outgoing.items():
        if sender in old.switched and old.outgoing.get(sender) == kid:
            new.switched.add(sender)
        elif (refused := old.unverified.get(sender)) is not None:
            topic, digest, value = refused
            # Checked again under the new keys: verified with a current key, check itself
            # marks the sender switched.
            if check(topic, b"", value, new, digest=digest) is None and sender in new.switched:
                explained.add(sender)
    return explained


def _emitted(emitted_at: str) -> float | None:
    try:
        return parse_timestamp(emitted_at).timestamp()
    except ValueError:
        return None


def replay_problem(emitted_at: str, now: float, window: float, skew: float) -> str | None:
    """Return why a signed message emitted then is not taken now (STALE first), or None.

    Older than the window plus the skew allowed, or further ahead than the skew: a replay
    (the ledger's dedupe index answers only for the window: docs/ledger.md) or a sender
    whose clock is wrong. Its sender stops re-sending at the window (`resend_until`).
    """
    emitted = _emitted(emitted_at)
    if emitted is None:
        return f"{STALE}: emitted_at {emitted_at[:40]!r} is not a time"
    age = now - emitted
    if age > window + skew:
        return (
            f"{STALE}: emitted {age:.0f} s ago, older than the replay window"
            f" ({window:g} s, {skew:g} s of clock skew allowed)"
        )
    if -age > skew:
        return f"{STALE}: emitted {-age:.0f} s ahead of this host's clock (over {skew:g} s)"
    return None


def resend_until(emitted_at: str, window: float) -> float:
    """Return the wall-clock time after which a message emitted then is not sent again.

    The sender's side of `replay_problem`, without the skew: a re-send always reaches its
    receiver within window + skew, as long as the clocks agree that well (-inf: no time).
    """
    emitted = _emitted(emitted_at)
    return -math.inf if emitted is None else emitted + window


def seal(text: str, recipient: bytes) -> str:
    """Seal text to a public X25519 key (an anonymous sealed box): only its owner opens it."""
    box = nacl.public.SealedBox(nacl.public.PublicKey(recipient))
    return SEALED_PREFIX + base64.b64encode(box.encrypt(text.encode())).decode()


def is_sealed(value: object) -> bool:
    """Return whether a value is a sealed note."""
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def open_sealed(value: str, key: SealKey) -> str:
    """Open a sealed note; raise ValueError when it is not one sealed to this key."""
    if not is_sealed(value):
        raise ValueError("not a sealed note")
    try:
        raw = base64.b64decode(value[len(SEALED_PREFIX) :], validate=True)
        box = nacl.public.SealedBox(nacl.public.PrivateKey(key.private))
        return box.decrypt(raw).decode()
    except (binascii.Error, nacl.exceptions.CryptoError, UnicodeDecodeError) as exc:
        raise ValueError(f"the sealed note does not open with this key: {exc}") from None


def seal_note(text: str, signing: Signing | None) -> str:
    """Return note_to_human sealed to the operator's key, or as it is in a fleet without one."""
    if signing is None or signing.seal_to is None or is_sealed(text):
        return text
    return seal(text, signing.seal_to)


def incident_due(last: float | None, now: float, window: float = FORGERY_WINDOW) -> bool:
    """Return whether a forgery seen at now deserves a war-room incident (one per window)."""
    return last is None or now - last >= window
