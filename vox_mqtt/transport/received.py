"""What a session received (`Inbound`), and the verdict on its signature.

Verified on the event loop for one message, a batch on a thread.

A verification is most of what a signed message costs its receiver (docs/performance.md,
signatures). When a single message waits, it is verified at once on the loop: nothing is
added to its latency. When several wait, the cheap part (finding the key, the bytes the
signature covers) is done on the loop and the verifications go to one worker thread, which
runs libsodium without the GIL (PyNaCl's cffi releases it): the loop serves the rest of the
process meanwhile, on the second core. Either way the session yields none of them before
all of them have their verdict, in the order received (docs/security.md).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from paho.mqtt.properties import Properties

from vox_mqtt.protocol.signing import Proof, Signing, verified
from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.signing import Unverified, Verdict, first_step, last_step

__all__ = ["BATCH", "MAX_BATCH", "Inbound", "Received", "verdicts", "verify_all"]

Received = tuple[str, bytes, RawProperties | Properties | None]  # topic, payload, properties
BATCH: Final = 2  # verifications that go to the worker thread together, at least
MAX_BATCH: Final = 64  # messages a session takes from its queue at once, at most

_INBOUND = {  # paho property name -> Inbound.properties key
    "ContentType": "content_type",
    "MessageExpiryInterval": "message_expiry_interval",
    "UserProperty": "user_properties",
}


@dataclass(frozen=True, kw_only=True)
class Inbound:
    """One message received on a subscription."""

    topic: str
    payload: bytes
    retain: bool
    # Left packed as received: no agent reads them, and decoding costs more than the rest of
    # the PUBLISH (see _mqttdecode.py).
    raw_properties: RawProperties | Properties | None = None
    # The message's `vox-sig` as received, and why it may not be believed (None: it may,
    # or signatures are off); set by the session before anyone sees it (docs/security.md).
    signature: str | None = None
    forgery: str | None = None
    digest: bytes | None = field(default=None, repr=False)  # SHA-256 of the payload, if checked

    @functools.cached_property
    def properties(self) -> dict[str, Any]:
        """Return content_type, message_expiry_interval (seconds left), user_properties."""
        raw = self.raw_properties
        if isinstance(raw, RawProperties):
            raw = raw.decode()
        return {k: getattr(raw, n) for n, k in _INBOUND.items() if hasattr(raw, n)}


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _worker() -> ThreadPoolExecutor:
    """Return the one verifying thread of this process (every session's), started once."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vox-verify")
        return _pool


def verify_all(proofs: Sequence[Proof]) -> list[bool]:
    """Verify each proof; what the worker thread runs for a batch."""
    return [verified(proof) for proof in proofs]


async def verdicts(
    signing: Signing, received: Sequence[Received], *, batch: int = BATCH
) -> list[Verdict]:
    """Return the verdict on each received message, in order (signing's mode is not "off").

    Fewer than `batch` verifications: on the loop, without suspending. More: on the worker
    thread, awaited together.
    """
    steps = [first_step(signing, topic, payload, raw) for topic, payload, raw in received]
    left = [step for step in steps if isinstance(step, Unverified)]
    if len(left) >= batch:
        proofs = [step.proof for step in left]
        oks = iter(await asyncio.wrap_future(_worker().submit(verify_all, proofs)))
    else:
        oks = iter([verified(step.proof) for step in left])
    return [last_step(step, next(oks)) if isinstance(step, Unverified) else step for step in steps]
