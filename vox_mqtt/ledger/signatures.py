"""Checking the signatures a ledger kept: it proves who sent each message it recorded.

Each received (or duplicate) row of a signed fleet keeps the message's `vox-sig`, its topic
and the SHA-256 of its payload (docs/ledger.md); the signature covers exactly those, so it
verifies without the payload, which the ledger never keeps. A pure function over rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.protocol.signing import Keyring, sender_of, verify_digest

__all__ = ["SignatureReport", "check_signatures"]

_RECEIVED = frozenset({LedgerAction.RECEIVED, LedgerAction.DUPLICATE})


@dataclass(frozen=True)
class SignatureReport:
    """What the received rows' signatures say."""

    verified: int = 0
    unsigned: int = 0  # received before signatures, or in "accept" mode
    problems: tuple[tuple[int, str], ...] = field(default_factory=tuple)  # (row id, why)

    @property
    def ok(self) -> bool:
        """Return whether every signature kept verified."""
        return not self.problems


def _problem(details: Mapping[str, Any], keyring: Keyring) -> str | None:
    value, topic, digest = (details.get(k) for k in ("signature", "topic", "payload_sha256"))
    if not isinstance(topic, str) or not isinstance(digest, str) or not isinstance(value, str):
        return "the row keeps a signature without its topic or payload digest"
    owner = keyring.public(value.partition(".")[0])
    sender = sender_of(topic)
    if owner is None:
        return f"signed with key {value.partition('.')[0]}, which the keys file does not know"
    if owner[0] != sender:
        return f"signed by {owner[0]}, not by {sender}, the sender its topic names"
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return "its payload digest is not hex"
    if not verify_digest(topic, raw, value, owner[1]):
        return f"the signature of {sender} does not verify"
    return None


def check_signatures(rows: Iterable[Mapping[str, Any]], keyring: Keyring) -> SignatureReport:
    """Verify the signature of every received row against keyring (retired keys included)."""
    verified = unsigned = 0
    problems: list[tuple[int, str]] = []
    for row in rows:
        details = row.get("details")
        if row.get("action") not in _RECEIVED or not isinstance(details, Mapping):
            continue
        if "signature" not in details:
            unsigned += 1
            continue
        problem = _problem(details, keyring)
        if problem is None:
            verified += 1
        else:
            problems.append((int(row["id"]), problem))
    return SignatureReport(verified, unsigned, tuple(sorted(problems)))
