"""The VOX envelope, its message types and payload models, and the one parser from bytes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal
from uuid import UUID, uuid4

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from .errors import InvalidMessage

__all__ = [
    "ERROR_CODES",
    "MAX_MESSAGE_BYTES",
    "MSG_ACKNOWLEDGED",
    "MSG_COMMAND_ERROR",
    "MSG_COMMAND_REQUEST",
    "MSG_COMMAND_RESULT",
    "MSG_DATA_REQUEST",
    "MSG_DATA_RESPONSE",
    "MSG_JOB_DETECTED",
    "MSG_SYSTEM_FAILURE",
    "PAYLOAD_MODELS",
    "CommandError",
    "CommandRequest",
    "CommandResult",
    "DataRequest",
    "DataResponse",
    "ErrorCode",
    "JobDetected",
    "MessageAcknowledged",
    "Price",
    "SystemFailure",
    "VOXMessage",
    "new_message",
    "now_iso",
    "parse",
    "parse_timestamp",
    "serialize",
]

# Envelope-level types of seed 000.
MSG_COMMAND_REQUEST: Final = "command_request"
MSG_ACKNOWLEDGED: Final = "message_acknowledged"
MSG_COMMAND_RESULT: Final = "command_result"
MSG_COMMAND_ERROR: Final = "command_error"
# Domain types of contract v1 (seed 003).
MSG_JOB_DETECTED: Final = "job_detected"
MSG_DATA_REQUEST: Final = "data_request"
MSG_DATA_RESPONSE: Final = "data_response"
MSG_SYSTEM_FAILURE: Final = "system_failure"

MAX_MESSAGE_BYTES: Final = 256 * 1024


class ErrorCode:
    """The codes a command_error carries."""

    NO_ROUTE: Final = "NO_ROUTE"
    TARGET_INACTIVE: Final = "TARGET_INACTIVE"
    TIMEOUT: Final = "TIMEOUT"
    HANDLER_ERROR: Final = "HANDLER_ERROR"
    INVALID_MESSAGE: Final = "INVALID_MESSAGE"
    UNAUTHORIZED_SOURCE: Final = "UNAUTHORIZED_SOURCE"
    DELIVERY_FAILED: Final = "DELIVERY_FAILED"
    SHUTTING_DOWN: Final = "SHUTTING_DOWN"


ERROR_CODES: Final = frozenset(
    v for k, v in vars(ErrorCode).items() if not k.startswith("_") and isinstance(v, str)
)


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


def now_iso() -> str:
    """Return the current time as ISO-8601 UTC with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class VOXMessage(BaseModel):
    """The universal, immutable VOX envelope of seed 000."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: UUID
    message_source: StrictStr
    emitted_at: IsoTimestamp
    source: UUID
    target: UUID
    type: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]
    details: dict[str, Any]
    reply_to: UUID | None = None

    def payload(self) -> BaseModel | None:
        """Return details as the typed payload model of this type, or None if the type is unknown."""
        model = PAYLOAD_MODELS.get(self.type)
        return None if model is None else model.model_validate(self.details)

    def reply(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        message_source: str | None = None,
    ) -> VOXMessage:
        """Build the answer to this message: source and target swapped, reply_to set."""
        return new_message(
            type,
            source=self.target,
            target=self.source,
            details=details,
            reply_to=self.message_id,
            message_source=self.message_source if message_source is None else message_source,
        )

    def acknowledgement(self, *, message_source: str | None = None) -> VOXMessage:
        """Build the message_acknowledged for this message."""
        return self.reply(
            MSG_ACKNOWLEDGED,
            MessageAcknowledged(in_response_to=self.message_id),
            message_source=message_source,
        )


def new_message(
    type: str,
    *,
    source: UUID,
    target: UUID,
    details: dict[str, Any] | BaseModel,
    message_source: str = "vox-mqtt",
    reply_to: UUID | None = None,
) -> VOXMessage:
    """Build a fresh, validated message with a new id and the current time."""
    if isinstance(details, BaseModel):
        details = details.model_dump(mode="json", exclude_none=True)
    message = VOXMessage(
        message_id=uuid4(),
        message_source=message_source,
        emitted_at=now_iso(),
        source=source,
        target=target,
        type=type,
        details=details,
        reply_to=reply_to,
    )
    _validate_payload(message)
    return message


def serialize(message: VOXMessage) -> bytes:
    """Encode a message as compact UTF-8 JSON, in field order, omitting an absent reply_to."""
    return message.model_dump_json(exclude_none=True).encode()


def parse(data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_MESSAGE_BYTES) -> VOXMessage:
    """Decode and validate one message; raise InvalidMessage with the reason for anything else."""
    raw = bytes(data)
    if len(raw) > max_bytes:
        raise InvalidMessage(
            f"message is {len(raw)} bytes, over the {max_bytes}-byte limit",
            **_peek_identity(raw[:4096]),
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"message is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        message = VOXMessage.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidMessage(_describe(exc), **_peek_identity(raw)) from None
    except (ValueError, RecursionError) as exc:  # pragma: no cover - pydantic wraps these today
        raise InvalidMessage(f"message is not valid JSON: {exc}") from None
    _validate_payload(message)
    return message


def _validate_payload(message: VOXMessage) -> None:
    try:
        message.payload()
    except ValidationError as exc:
        raise InvalidMessage(
            f"{message.type} details: {_describe(exc)}",
            message_id=message.message_id,
            source=message.source,
        ) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "message"
        if error["type"] == "json_invalid":
            problems.append(f"not valid JSON ({error['msg'].removeprefix('Invalid JSON: ')})")
        elif error["type"] == "model_type":
            problems.append("not a JSON object")
        else:
            problems.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


_UUID_TEXT = re.compile(r"^[0-9a-fA-F-]{32,36}$")


def _peek_identity(raw: bytes) -> dict[str, UUID | None]:
    """Find message_id and source in a broken message, if they can be read at all."""
    found: dict[str, UUID | None] = {"message_id": None, "source": None}
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return found
    if not isinstance(obj, dict):
        return found
    for key in found:
        value = obj.get(key)
        if isinstance(value, str) and _UUID_TEXT.match(value):
            try:
                found[key] = UUID(value)
            except ValueError:
                pass
    return found


# --- payload models -------------------------------------------------------------------------


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class Price(BaseModel):
    """An amount of money in whole units of an ISO-4217 currency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    currency: Annotated[StrictStr, Field(pattern=r"^[A-Z]{3}$")]
    value: Annotated[StrictInt, Field(ge=0)]


class CommandRequest(_Payload):
    """Ask the target to run a named command."""

    command: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    params: dict[str, Any] = Field(default_factory=dict)
    # Optional deadline; it becomes the MQTT message expiry and bounds the re-sends.
    deadline: IsoTimestamp | None = None


class MessageAcknowledged(_Payload):
    """Confirm receipt and logging of a message (not approval)."""

    in_response_to: UUID


class CommandResult(_Payload):
    """The successful outcome of a command_request."""

    command: StrictStr | None = None
    result: Any = None
    summary: StrictStr | None = None
    # The agent that answers for the work: a master reports itself, never its child.
    handled_by: UUID | None = None


class CommandError(_Payload):
    """A delivery or execution failure of a command_request."""

    code: Annotated[StrictStr, Field(pattern=r"^[A-Z][A-Z0-9_]*$")]
    error: StrictStr
    command: StrictStr | None = None


class SystemFailure(_Payload):
    """An alert for the war room."""

    error_code: Annotated[StrictStr, Field(min_length=1)]
    severity: Literal["CRITICAL", "ERROR", "WARNING", "INFO"]
    description: StrictStr
    subject: UUID | None = None
    epoch: StrictInt | None = None
    resolved: StrictBool = False


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
        if parse_timestamp(self.end_time) < parse_timestamp(self.start_time):
            raise ValueError("end_time is before start_time")
        return self


class DataRequest(_Payload):
    """The root asks for administrative data (seed 003)."""

    subject: Annotated[StrictStr, Field(min_length=1)]
    parameters: dict[str, Any] = Field(default_factory=dict)


class DataResponse(_Payload):
    """The answer to a data_request (seed 003)."""

    request_id: UUID
    total: Price | None = None
    attachments: list[StrictStr] = Field(default_factory=list)


PAYLOAD_MODELS: Final[dict[str, type[BaseModel]]] = {
    MSG_COMMAND_REQUEST: CommandRequest,
    MSG_ACKNOWLEDGED: MessageAcknowledged,
    MSG_COMMAND_RESULT: CommandResult,
    MSG_COMMAND_ERROR: CommandError,
    MSG_SYSTEM_FAILURE: SystemFailure,
    MSG_JOB_DETECTED: JobDetected,
    MSG_DATA_REQUEST: DataRequest,
    MSG_DATA_RESPONSE: DataResponse,
}
