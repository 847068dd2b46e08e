"""A ledger's message_source in its two stored forms: digest for rows, sealed for resuming.

Rows keep a keyed digest (docs/ledger.md): the file alone names no one. What a restart
must send again (an outbox entry, a command acknowledged but not yet started) keeps the
origin's message_source sealed under the same key instead, and only until it is sent or
started: a message that leaves the agent never carries a ledger-internal value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vox_mqtt.ledger._schema import _load_key, _source_digest
from vox_mqtt.protocol.errors import LedgerError

__all__ = ["DEFAULT", "SEALED", "SourceKeeper"]

SEALED: Final = "sealed:"
# What an agent's own messages carry unless configured (AgentConfig.message_source).
DEFAULT: Final = "vox-mqtt"
_FIELD: Final = '"message_source":'
_SEAL_INFO: Final = b"vox-mqtt ledger: sealed message_source"
_NONCE: Final = 12
# Nonces read from the OS 256 at a time: os.urandom releases the GIL, and on the event
# loop's thread each release lets a ledger writer thread in before the loop goes on (about
# 40 us per seal under load, docs/performance.md). A fork's child never reuses them.
_NONCES = bytearray()
os.register_at_fork(after_in_child=_NONCES.clear)


def _nonce() -> bytes:
    if not _NONCES:
        _NONCES.extend(os.urandom(_NONCE * 256))
    chunk = bytes(_NONCES[-_NONCE:])
    del _NONCES[-_NONCE:]
    return chunk


class SourceKeeper:
    """Digest, seal and unseal message_source values under one ledger's key."""

    def __init__(self, *, clear: bool, key: bytes | None) -> None:
        self.clear = clear  # sources kept in clear: nothing to digest or seal
        self.key = key
        self._digests: dict[str, str] = {}  # message_source -> digest (a few senders)
        # The sealing cipher, derived once per key: a seal per sent message would otherwise
        # pay an HMAC and a cipher set-up each time.
        self._sealer: tuple[bytes, AESGCM] | None = None

    def load_key(self, path: Path, *, create: bool) -> None:
        """Read the ledger's key beside it (creating it when create), unless not needed."""
        key = path.with_suffix(".key")
        if self.clear or self.key is not None or not (create or key.is_file()):
            return
        try:
            self.key = _load_key(key)
        except (OSError, ValueError) as exc:
            raise LedgerError(f"ledger {path}: digest key: {exc}") from None

    def _key(self, path: object) -> bytes:
        if self.key is None:
            raise LedgerError(f"ledger {path} is not open")
        return self.key

    def stored(self, message_source: str, path: object) -> str:
        """Return message_source as rows store it: a keyed digest, or clear if asked."""
        if self.clear:
            return message_source[:200]
        known = self._digests.get(message_source)
        if known is None:
            if len(self._digests) >= 256:  # a few senders; never grow without bound
                self._digests.clear()
            known = _source_digest(self._key(path), message_source)
            self._digests[message_source] = known
        return known

    def _aead(self, path: object) -> AESGCM:
        key = self._key(path)
        if self._sealer is None or self._sealer[0] is not key:
            self._sealer = (key, AESGCM(hmac.new(key, _SEAL_INFO, hashlib.sha256).digest()))
        return self._sealer[1]

    def seal(self, message_source: str, path: object) -> str:
        """Return message_source sealed for a restart (clear if the ledger keeps it so)."""
        if self.clear:
            return message_source
        nonce = _nonce()
        sealed = self._aead(path).encrypt(
            nonce, message_source.encode("utf-8", "surrogatepass"), None
        )
        return SEALED + base64.urlsafe_b64encode(nonce + sealed).decode()

    def unseal(self, value: str, path: object) -> str | None:
        """Return the message_source a sealed value holds; None if it is not one of ours."""
        if not value.startswith(SEALED):
            return None if value.startswith("hmac:") else value
        try:
            raw = base64.urlsafe_b64decode(value[len(SEALED) :])
            clear = self._aead(path).decrypt(raw[:_NONCE], raw[_NONCE:], None)
        except (ValueError, InvalidTag):
            return None
        return clear.decode("utf-8", "surrogatepass")

    def unseal_payload(self, payload: bytes, path: object, default: str = DEFAULT) -> bytes:
        """Return an outbox payload with its envelope's message_source in clear again."""
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            return payload
        # The envelope's field comes before details, so the first match is the envelope's.
        at = text.find(_FIELD)
        if at < 0:
            return payload
        start = at + len(_FIELD)
        while text[start : start + 1].isspace():
            start += 1
        try:
            value, end = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            return payload
        if not isinstance(value, str):
            return payload
        clear = self.unseal(value, path)
        if clear is None:
            # Never a digest on the wire: a value this key cannot open says nothing.
            clear = default
        return (text[:start] + json.dumps(clear, ensure_ascii=False) + text[end:]).encode()

    def with_origins(
        self, rows: list[dict[str, Any]], held: Iterable[Sequence[Any]], path: object
    ) -> list[dict[str, Any]]:
        """Return pending command rows, each with `origin_source` from what was held."""
        kept = {str(message_id): str(sealed) for message_id, sealed in held}
        for row in rows:
            sealed = kept.get(str(row.get("message_id")))
            row["origin_source"] = None if sealed is None else self.unseal(sealed, path)
        return rows
