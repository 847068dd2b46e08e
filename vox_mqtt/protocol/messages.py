"""The VOX envelope, its own message types and payload models, and the one parser from bytes.

The domain payloads of contract v1 are in protocol/domain.py; a request's life in
protocol/lifecycle.py. PAYLOAD_MODELS maps every type to its model.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Self, TypeVar
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from vox_mqtt.protocol._fields import UUID_FORM, IsoTimestamp, Uuid, parse_timestamp
from vox_mqtt.protocol._jsonvalue import FrozenDict, FrozenList, freeze_json, thaw_json
from vox_mqtt.protocol.domain import (
    MSG_DATA_REQUEST,
    MSG_DATA_RESPONSE,
    MSG_DECISION,
    MSG_DECISION_RECORDED,
    MSG_JOB_DETECTED,
    MSG_SYSTEM_FAILURE,
    DataRequest,
    DataResponse,
    Decision,
    JobDetected,
    SystemFailure,
)
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.lifecycle import (
    MSG_CANCEL_REPORT,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_PROGRESS,
    MSG_STATUS_QUERY,
    MSG_STATUS_REPORT,
    CancelReport,
    CancelRequest,
    CommandProgress,
    StatusQuery,
    StatusReport,
)
from vox_mqtt.protocol.validation import describe

_Model = TypeVar("_Model", bound=BaseModel)

__all__ = [
    "CONTENT_TYPE",
    "ERROR_CODES",
    "MAX_ADVERTISED_COMMANDS",
    "MAX_COMMAND_NAME",
    "MAX_DEADLINE_SECONDS",
    "MAX_EPOCH",
    "MAX_EXPIRY_SECONDS",
    "MAX_HEARTBEAT_INTERVAL",
    "MAX_MESSAGE_BYTES",
    "MAX_PACKET_BYTES",
    "MSG_ACKNOWLEDGED",
    "MSG_AGENT_STATUS",
    "MSG_CANCEL_REPORT",
    "MSG_CANCEL_REQUEST",
    "MSG_COMMAND_ERROR",
    "MSG_COMMAND_PROGRESS",
    "MSG_COMMAND_REQUEST",
    "MSG_COMMAND_RESULT",
    "MSG_STATUS_QUERY",
    "MSG_STATUS_REPORT",
    "PAYLOAD_MODELS",
    "AgentStatus",
    "CancelReport",
    "CancelRequest",
    "CommandError",
    "CommandProgress",
    "CommandRequest",
    "CommandResult",
    "ErrorCode",
    "FrozenDict",
    "FrozenList",
    "IsoTimestamp",
    "LedgerHead",
    "MessageAcknowledged",
    "StatusQuery",
    "StatusReport",
    "Uuid",
    "VOXMessage",
    "expiry_seconds",
    "new_message",
    "now_iso",
    "parse",
    "parse_timestamp",
    "serialize",
    "thaw_json",
    "timeout_refused",
]

# Envelope-level types of seed 000.
MSG_COMMAND_REQUEST: Final = "command_request"
MSG_ACKNOWLEDGED: Final = "message_acknowledged"
MSG_COMMAND_RESULT: Final = "command_result"
MSG_COMMAND_ERROR: Final = "command_error"
# The domain types of contract v1 (seed 003) and their payloads are in protocol/domain.py.
# Liveness (the retained status of docs/liveness.md).
MSG_AGENT_STATUS: Final = "agent_status"

MAX_MESSAGE_BYTES: Final = 256 * 1024
# A whole MQTT packet: a payload of MAX_MESSAGE_BYTES plus its topic and v5 properties. The
# broker accepts none larger (broker/render.py) and the transport reads none larger
# (transport/packets.split_packet): a declared length beyond it is refused before it arrives.
MAX_PACKET_BYTES: Final = MAX_MESSAGE_BYTES + 16 * 1024
# The furthest a command deadline may lie ahead. MQTT's message expiry is a 32-bit count of
# seconds (about 136 years); a deadline beyond any real job's is a mistake or an attack.
MAX_DEADLINE_SECONDS: Final = 30 * 24 * 3600
MAX_EXPIRY_SECONDS: Final = 2**32 - 1
# The MQTT v5 content-type property of every VOX publish.
CONTENT_TYPE: Final = "application/json"


def timeout_refused(seconds: float, name: str = "timeout") -> str | None:
    """Say why a request's timeout cannot be its deadline (now + it), or None if it can."""
    if 0 < seconds <= MAX_DEADLINE_SECONDS:
        return None
    days = MAX_DEADLINE_SECONDS // 86400
    return f"{name} must be more than 0 and at most {days} days ({MAX_DEADLINE_SECONDS} s)"


class ErrorCode(StrEnum):
    """The codes a command_error carries."""

    NO_ROUTE = "NO_ROUTE"
    TARGET_INACTIVE = "TARGET_INACTIVE"
    TIMEOUT = "TIMEOUT"
    HANDLER_ERROR = "HANDLER_ERROR"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    # The params do not fit the command's signature or types: refused before its handler ran.
    INVALID_PARAMS = "INVALID_PARAMS"
    UNAUTHORIZED_SOURCE = "UNAUTHORIZED_SOURCE"
    DELIVERY_FAILED = "DELIVERY_FAILED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    # The answer, as a message, would be over the size limit: it is never published.
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    # The agent cannot record (its disk is full): it accepts nothing it could not keep.
    LEDGER_UNAVAILABLE = "LEDGER_UNAVAILABLE"
    # The request was canceled by its master, or by a deadline its master gave up on.
    CANCELED = "CANCELED"
    # The agent serves as many status queries as it may at once (docs/messages.md).
    BUSY = "BUSY"


ERROR_CODES: Final = frozenset(code.value for code in ErrorCode)


def expiry_seconds(deadline: str, *, now: float | None = None) -> int:
    """Return the MQTT message expiry for a deadline: the seconds left, within 1..2**32-1."""
    left = parse_timestamp(deadline).timestamp() - (time.time() if now is None else now)
    return int(min(MAX_EXPIRY_SECONDS, max(1.0, left)))


def _frozen(model: _Model) -> _Model:
    """Freeze the dicts and lists a validated payload holds, its extra fields too.

    The payload view is cached on its message and handed to every reader: a reader that
    changed `params` would change the message for all who read it after (seed 003).
    """
    for values in (model.__dict__, model.__pydantic_extra__ or {}):
        for name, value in values.items():
            if isinstance(value, BaseModel):
                _frozen(value)
            elif isinstance(value, dict | list):
                values[name] = freeze_json(value)
    return model


def _freeze_details(details: dict[str, Any]) -> dict[str, Any]:
    # Frozen all the way down: a message is immutable, so what was validated is what is sent.
    frozen: dict[str, Any] = freeze_json(details)
    return frozen


# The last millisecond asked for and its text: the rows and messages of one turn of the loop
# carry the same few milliseconds, so most calls build no datetime. One tuple, swapped whole,
# so a thread never reads one millisecond's number with another's text.
_last_now: tuple[int, str] = (-1, "")


def now_iso() -> str:
    """Return the current time as ISO-8601 UTC with milliseconds."""
    global _last_now
    millis = int(time.time() * 1000)
    last_millis, text = _last_now
    if millis != last_millis:
        text = datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="milliseconds")
        _last_now = (millis, text)
    return text


class VOXMessage(BaseModel):
    """The universal, immutable VOX envelope of seed 000."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: Uuid
    message_source: Annotated[StrictStr, Field(min_length=1)]
    emitted_at: IsoTimestamp
    source: Uuid
    target: Uuid
    type: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]
    details: Annotated[dict[str, Any], AfterValidator(_freeze_details)]
    reply_to: Uuid | None = None
    # Worked out once per message, not at every use: the envelope is immutable.
    _payload: BaseModel | None = PrivateAttr(default=None)
    _json: bytes | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # The fields only: pydantic would also compare what was worked out and cached.
        if not isinstance(other, VOXMessage):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = BaseModel.__hash__

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Return a copy with `update` applied, validated like any new message.

        A changed copy is another message, so it gets a message_id of its own (unless the
        update names one): once emitted, a message cannot be modified (seed 003).
        """
        if not update:
            return self  # immutable all the way down: the copy would be the same message
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        fields["message_id"] = _new_id()
        try:
            copy = self.model_validate({**fields, **update})
        except ValidationError as exc:
            raise InvalidMessage(describe(exc)) from None
        _validate_payload(copy)
        return copy

    def payload(self) -> BaseModel | None:
        """Return details as this type's payload model, or None if the type is unknown."""
        # The private dict directly: pydantic's __getattr__ for private names is slow.
        cache = self.__pydantic_private__
        assert cache is not None
        known: BaseModel | None = cache["_payload"]
        if known is None:
            model = PAYLOAD_MODELS.get(self.type)
            if model is None:
                return None
            known = cache["_payload"] = _frozen(model.model_validate(self.details))
        return known

    def payload_as(self, model: builtins.type[_Model]) -> _Model:
        """Return details as the given payload model (validated once per message and model)."""
        known = self.payload() if PAYLOAD_MODELS.get(self.type) is model else None
        return known if isinstance(known, model) else _frozen(model.model_validate(self.details))

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
    try:
        message = VOXMessage(
            message_id=_new_id(),
            message_source=message_source,
            emitted_at=now_iso(),
            source=source,
            target=target,
            type=type,
            details=details,
            reply_to=reply_to,
        )
    except ValidationError as exc:
        raise InvalidMessage(describe(exc)) from None
    _validate_payload(message)
    return message


_RANDOM = bytearray()
os.register_at_fork(after_in_child=_RANDOM.clear)  # a child never reuses its parent's ids


def _new_id() -> UUID:
    """Return a random (version 4) UUID, reading the OS's randomness 256 ids at a time."""
    if not _RANDOM:
        _RANDOM.extend(os.urandom(16 * 256))
    chunk = bytes(_RANDOM[-16:])
    del _RANDOM[-16:]
    return UUID(bytes=chunk, version=4)


def serialize(message: VOXMessage) -> bytes:
    """Encode a message as compact UTF-8 JSON, in field order, omitting an absent reply_to."""
    cache = message.__pydantic_private__
    assert cache is not None
    known: bytes | None = cache["_json"]
    if known is None:
        known = cache["_json"] = message.model_dump_json(exclude_none=True).encode()
    return known


def parse(
    data: bytes | bytearray | memoryview | str, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> VOXMessage:
    """Decode and validate one message; raise InvalidMessage with the reason for anything else."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise InvalidMessage(
            f"message is {len(raw)} bytes, over the {max_bytes}-byte limit",
            **_peek_identity(raw, whole=False),
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"message is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        message = VOXMessage.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc), **_peek_identity(raw)) from None
    except (ValueError, RecursionError) as exc:  # pragma: no cover - pydantic wraps these today
        raise InvalidMessage(f"message is not valid JSON: {exc}") from None
    _validate_payload(message)
    return message


def _validate_payload(message: VOXMessage) -> None:
    try:
        message.payload()
    except ValidationError as exc:
        raise InvalidMessage(
            f"{message.type}: {describe(exc, within='details')}",
            message_id=message.message_id,
            source=message.source,
        ) from None


def _peek_identity(raw: bytes, *, whole: bool = True) -> dict[str, UUID | None]:
    """Find message_id and source in a broken message, if they can be read at all."""
    found: dict[str, UUID | None] = {"message_id": None, "source": None}
    if whole:
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            return found
        values = obj if isinstance(obj, dict) else {}
    else:
        # Too big to decode: look for the fields near the start, where senders put them.
        values = {}
        for key in found:
            match = re.search(rb'"%s"\s*:\s*"([^"]{36})"' % key.encode(), raw[:4096])
            if match is not None:
                values[key] = match.group(1).decode("utf-8", "replace")
    for key in found:
        value = values.get(key)
        if isinstance(value, str) and UUID_FORM.fullmatch(value):
            found[key] = UUID(value)
    return found


# --- payload models -------------------------------------------------------------------------


class _Payload(BaseModel):
    # Payloads may grow new fields (contract v1 "new types may be added"); keep them.
    model_config = ConfigDict(frozen=True, extra="allow")


class CommandRequest(_Payload):
    """Ask the target to run a named command."""

    command: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    params: dict[str, Any] = Field(default_factory=dict)
    # Optional deadline; it becomes the MQTT message expiry and bounds the re-sends.
    deadline: IsoTimestamp | None = None

    @model_validator(mode="after")
    def _deadline_in_reach(self) -> CommandRequest:
        if self.deadline is None:
            return self
        try:
            ahead = parse_timestamp(self.deadline).timestamp() - time.time()
        except (OverflowError, OSError, ValueError):
            ahead = math.inf  # beyond what the platform's clock can even represent
        if ahead > MAX_DEADLINE_SECONDS:
            raise ValueError(
                f"deadline {self.deadline} is more than {MAX_DEADLINE_SECONDS // 86400} days"
                " away; give one within that"
            )
        return self


class MessageAcknowledged(_Payload):
    """Confirm receipt and logging of a message (not approval)."""

    in_response_to: Uuid


class CommandResult(_Payload):
    """The successful outcome of a command_request."""

    command: StrictStr | None = None
    result: Any = None
    summary: StrictStr | None = None
    # The agent that answers for the work: a master reports itself, never its child.
    handled_by: Uuid | None = None


class CommandError(_Payload):
    """A delivery or execution failure of a command_request."""

    code: Annotated[StrictStr, Field(pattern=r"^[A-Z][A-Z0-9_]*$")]
    error: StrictStr
    command: StrictStr | None = None


# A status is believed and repeated up the tree only within these bounds
# (docs/liveness.md, "What a status may say"): no child can push its master past a limit.
MAX_ADVERTISED_COMMANDS: Final = 256
MAX_COMMAND_NAME: Final = 128
MAX_HEARTBEAT_INTERVAL: Final = 3600.0
MAX_EPOCH: Final = 2**53 - 1
CommandName = Annotated[StrictStr, Field(min_length=1, max_length=MAX_COMMAND_NAME)]


class LedgerHead(BaseModel):
    """The newest row of an agent's ledger, as its status reports it to its master."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]  # a SQLite rowid
    hash: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


class AgentStatus(BaseModel):
    """The details of a retained `agent_status` message (birth, heartbeat, will, shutdown)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    # DEGRADED: connected but refusing work it could not record (its reason in error_code).
    # None on a running agent's full status (a report): its liveness is on its presence
    # alone, which carries the will, so no retained copy says ACTIVE once the agent is
    # dead (docs/liveness.md, "Which topic tells").
    status: Literal["ACTIVE", "INACTIVE", "DEGRADED"] | None = None
    error_code: Annotated[StrictStr, Field(max_length=64)] | None = None
    epoch: Annotated[StrictInt, Field(ge=0, le=MAX_EPOCH)]
    started_at: IsoTimestamp
    heartbeat_interval: Annotated[float, Field(gt=0, le=MAX_HEARTBEAT_INTERVAL)]
    commands: Annotated[list[CommandName], Field(max_length=MAX_ADVERTISED_COMMANDS)] = Field(
        default_factory=list
    )
    # Served below while ACTIVE, by none ACTIVE now: TARGET_INACTIVE, not NO_ROUTE (liveness.md).
    commands_down: Annotated[list[CommandName], Field(max_length=MAX_ADVERTISED_COMMANDS)] = []
    version: Annotated[StrictStr, Field(max_length=64)] = ""
    metrics: dict[str, Any] = Field(default_factory=dict)
    ledger_head: LedgerHead | None = None
    # Why it is DEGRADED (or what its error_code means), for a person.
    detail: Annotated[StrictStr, Field(max_length=300)] | None = None
    # Counts up in its epoch; older ones are ignored (not in the will: docs/liveness.md).
    sequence: Annotated[StrictInt, Field(ge=1, le=MAX_EPOCH)] | None = None
    # What each advertised command takes: {command: {"doc", "schema"}}, each entry within
    # its bound; a watcher keeps those in bounds, drops the rest (protocol/commandspec.py).
    # Absent from older agents and from the presence.
    params: dict[str, Any] | None = None


PAYLOAD_MODELS: Final[dict[str, type[BaseModel]]] = {
    MSG_COMMAND_REQUEST: CommandRequest,
    MSG_ACKNOWLEDGED: MessageAcknowledged,
    MSG_COMMAND_RESULT: CommandResult,
    MSG_COMMAND_ERROR: CommandError,
    MSG_SYSTEM_FAILURE: SystemFailure,
    MSG_JOB_DETECTED: JobDetected,
    MSG_DATA_REQUEST: DataRequest,
    MSG_DATA_RESPONSE: DataResponse,
    MSG_DECISION: Decision,
    MSG_DECISION_RECORDED: Decision,
    MSG_COMMAND_PROGRESS: CommandProgress,
    MSG_STATUS_QUERY: StatusQuery,
    MSG_STATUS_REPORT: StatusReport,
    MSG_CANCEL_REQUEST: CancelRequest,
    MSG_CANCEL_REPORT: CancelReport,
}
