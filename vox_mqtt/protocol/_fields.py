"""Field types the payload models share: a timezone-aware ISO timestamp and a UUID in text form."""

from __future__ import annotations

import re
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Final
from uuid import UUID

from pydantic import AfterValidator, BeforeValidator, StrictStr

__all__ = ["UUID_FORM", "IsoTimestamp", "Uuid", "parse_timestamp"]


# A message's emitted_at is read again at every step of its way (validation, its deadline,
# the ledger's dedupe index): parsed once. A refused text raises, and is never kept.
@lru_cache(maxsize=4096)
def parse_timestamp(value: str) -> datetime:
    """Parse an ISO-8601 timestamp, refusing one without a timezone."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO-8601 datetime") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"{value!r} has no timezone (write e.g. 2026-01-11T08:00:00-03:00)")
    return parsed


def _check_timestamp(value: str) -> str:
    parse_timestamp(value)
    # Kept as the sender wrote it, so a message re-serializes byte for byte.
    return value


IsoTimestamp = Annotated[StrictStr, AfterValidator(_check_timestamp)]

UUID_FORM: Final = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _check_uuid_text(value: object) -> object:
    # pydantic alone also takes hex without dashes, braces and urn:uuid:, which would
    # re-serialize differently from what the sender wrote (and signed, one day).
    if isinstance(value, str) and not UUID_FORM.fullmatch(value):
        raise ValueError(f"{value[:60]!r} is not a UUID (8-4-4-4-12 hex digits)")
    return value


Uuid = Annotated[UUID, BeforeValidator(_check_uuid_text)]
"""A UUID field that accepts only the 8-4-4-4-12 text form."""
