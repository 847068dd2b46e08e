"""The domain payloads of contract v1 (seed 003): a job found, data asked and answered, an alert,
the human's verdict; apart from the envelope and its own types (protocol/messages.py)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from vox_mqtt.protocol._fields import IsoTimestamp, Uuid, parse_timestamp

__all__ = [
    "MSG_DATA_REQUEST",
    "MSG_DATA_RESPONSE",
    "MSG_DECISION",
    "MSG_DECISION_RECORDED",
    "MSG_JOB_DETECTED",
    "MSG_SYSTEM_FAILURE",
    "DataRequest",
    "DataResponse",
    "Decision",
    "JobDetected",
    "Price",
    "SystemFailure",
]

# Domain types of contract v1 (seed 003).
MSG_JOB_DETECTED: Final = "job_detected"
MSG_DATA_REQUEST: Final = "data_request"
MSG_DATA_RESPONSE: Final = "data_response"
MSG_SYSTEM_FAILURE: Final = "system_failure"
# The human's verdict on a job, and its answer (docs/messages.md, decisions).
MSG_DECISION: Final = "decision"
MSG_DECISION_RECORDED: Final = "decision_recorded"


class _Payload(BaseModel):
    # Payloads may grow new fields (contract v1 "new types may be added"); keep them, as the
    # envelope's own payloads do (protocol/messages.py).
    model_config = ConfigDict(frozen=True, extra="allow")


def _check_currency(value: str) -> str:
    if not re.fullmatch(r"[A-Z]{3}", value):
        raise ValueError(f"{value[:20]!r} is not an ISO-4217 currency code (e.g. USD, EUR, BRL)")
    return value


class Price(BaseModel):
    """An amount of money in whole units of an ISO-4217 currency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    currency: Annotated[StrictStr, AfterValidator(_check_currency)]
    value: Annotated[StrictInt, Field(ge=0)]


class SystemFailure(_Payload):
    """An alert for the war room."""

    error_code: Annotated[StrictStr, Field(min_length=1)]
    severity: Literal["CRITICAL", "ERROR", "WARNING", "INFO"]
    description: StrictStr
    subject: Uuid | None = None
    epoch: StrictInt | None = None
    resolved: StrictBool = False


def _check_order(start: tuple[str, str | None], end: tuple[str, str | None]) -> None:
    """Refuse a (name, time) range whose end comes before its start."""
    (start_name, start_at), (end_name, end_at) = start, end
    if start_at is None or end_at is None:
        return
    if parse_timestamp(end_at) < parse_timestamp(start_at):
        raise ValueError(f"{end_name} {end_at} is before {start_name} {start_at}")


class JobDetected(_Payload):
    """A potential job a specialist found (seed 003)."""

    start_time: IsoTimestamp
    end_time: IsoTimestamp
    estimated_effort_minutes: Annotated[StrictInt, Field(ge=0)]
    price: Price
    # Never parsed by agents: only the root shows it to the human.
    note_to_human: StrictStr = ""

    @model_validator(mode="after")
    def _end_after_start(self) -> JobDetected:
        _check_order(("start_time", self.start_time), ("end_time", self.end_time))
        return self


class DataRequest(_Payload):
    """The root asks for administrative data (seed 003)."""

    subject: Annotated[StrictStr, Field(min_length=1)]
    parameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _dates_with_timezone(self) -> DataRequest:
        # Subjects define their own parameters; the seed's date range is checked if present.
        dates: dict[str, str] = {}
        for key in ("start_date", "end_date"):
            value = self.parameters.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"parameters.{key} must be an ISO-8601 string")
            try:
                parse_timestamp(value)
            except ValueError as exc:
                raise ValueError(f"parameters.{key}: {exc}") from None
            dates[key] = value
        _check_order(
            ("parameters.start_date", dates.get("start_date")),
            ("parameters.end_date", dates.get("end_date")),
        )
        return self


class DataResponse(_Payload):
    """The answer to a data_request (seed 003)."""

    request_id: Uuid
    total: Price | None = None
    attachments: list[StrictStr] = Field(default_factory=list)


class Decision(_Payload):
    """The human's verdict on a job_detected; its answer, decision_recorded, adds the outcome."""

    in_response_to: Uuid  # the job_detected as the receiver of this decision got it
    verdict: Literal["approve", "reject"]
    note: Annotated[StrictStr, Field(max_length=2000)] | None = None  # free text, never parsed
    outcome: Annotated[StrictStr, Field(max_length=1000)] | None = None  # decision_recorded
