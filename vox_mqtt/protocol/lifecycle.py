"""A request's life over the wire: progress, status and cancel (docs/messages.md, "Lifecycle").

`command_progress` climbs from a child to its master while it works on a request;
`status_query` / `status_report` ask a child where a request stands; `cancel_request` /
`cancel_report` stop one. None of them names an agent: a level passes its child's part up
as `below`, so the root learns how deep the work went, never who did it.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from vox_mqtt.protocol._fields import IsoTimestamp, Uuid
from vox_mqtt.protocol.requeststates import (
    CANCEL_STATES,
    FINAL_STATES,
    MAX_DEPTH,
    REQUEST_STATES,
    PartState,
    RequestState,
)

__all__ = [
    "CANCEL_STATES",
    "FINAL_STATES",
    "MAX_DEPTH",
    "MAX_HISTORY",
    "MAX_STATUS_WAIT",
    "MAX_TEXT",
    "MSG_CANCEL_REPORT",
    "MSG_CANCEL_REQUEST",
    "MSG_COMMAND_PROGRESS",
    "MSG_STATUS_QUERY",
    "MSG_STATUS_REPORT",
    "REQUEST_STATES",
    "CancelReport",
    "CancelRequest",
    "CancelState",
    "CommandProgress",
    "PartState",
    "ProgressState",
    "RequestState",
    "StatusPart",
    "StatusQuery",
    "StatusReport",
    "Transition",
]

MSG_COMMAND_PROGRESS: Final = "command_progress"
MSG_STATUS_QUERY: Final = "status_query"
MSG_STATUS_REPORT: Final = "status_report"
MSG_CANCEL_REQUEST: Final = "cancel_request"
MSG_CANCEL_REPORT: Final = "cancel_report"

# The longest free text a level may attach (a progress note, a cancel's reason, a why).
MAX_TEXT: Final = 200
# The longest a status_query may ask its receiver to take (seconds).
MAX_STATUS_WAIT: Final = 60.0
# The transitions a status report lists for one level at most (the newest kept).
MAX_HISTORY: Final = 32

Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]

# The states a command_progress and a cancel_report may carry, in the order their error
# names them (CANCEL_STATES is the latter's set: tests/unit/test_lifecycle_messages.py).
ProgressState = Literal[RequestState.WORKING, RequestState.DELEGATED]
CancelState = Literal[
    RequestState.COMPLETED,
    RequestState.FAILED,
    RequestState.CANCELED,
    RequestState.CANCELING,
    RequestState.EXPIRED,
    RequestState.REJECTED,
    RequestState.UNKNOWN,
]


def _words(kind: Any) -> list[str]:
    """The plain words a state type allows: an enum's values, a Literal's, a union's."""
    if isinstance(kind, type) and issubclass(kind, RequestState):
        return [str(state) for state in kind]
    if get_origin(kind) in (Literal, Union, types.UnionType):
        return [word for arg in get_args(kind) for word in _words(arg)]
    return [str(kind)]


def _only(kind: Any) -> BeforeValidator:
    """Take a state of `kind`, its plain word or its member; refuse anything else in the
    words a Literal of plain strings uses ("Input should be 'working' or 'delegated'"), so
    the reason a refused payload is recorded with does not name the enum."""
    words = _words(kind)
    allowed = frozenset(words)
    quoted = [repr(word) for word in words]
    expected = quoted[-1] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def check(value: Any) -> Any:
        if isinstance(value, str) and value in allowed:
            return value
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )

    return BeforeValidator(check)


class _Part(BaseModel):
    # Unknown fields are dropped, not kept: a relay re-sends what it validated, so
    # nothing a child adds (a name, an id) travels further up than the child's master.
    model_config = ConfigDict(frozen=True, extra="ignore")


def _depth(part: BaseModel | None) -> int:
    depth = 0
    while part is not None:
        depth += 1
        part = getattr(part, "below", None)
    return depth


class CommandProgress(_Part):
    """A child tells its master how far it is with a request (reply_to = the request)."""

    state: Annotated[ProgressState, _only(ProgressState)]
    fraction: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    text: Text | None = None
    seq: Annotated[StrictInt, Field(ge=1, le=2**53 - 1)]
    below: CommandProgress | None = None

    @model_validator(mode="after")
    def _bounded(self) -> CommandProgress:
        if _depth(self) > MAX_DEPTH:
            raise ValueError(f"progress nests more than {MAX_DEPTH} levels")
        if self.state is RequestState.WORKING and self.below is not None:
            raise ValueError("a working level has nothing below it (only a delegated one has)")
        return self


class Transition(_Part):
    """One state a request entered, and when."""

    state: Annotated[RequestState, _only(RequestState)]
    at: IsoTimestamp


class StatusPart(_Part):
    """One level's part of a status report; `below` is its child's part, one level down.

    `state` is "unreachable" (with `why`) when the level below did not answer in time.
    """

    state: Annotated[PartState, _only(PartState)]
    since: IsoTimestamp | None = None
    history: Annotated[list[Transition], Field(max_length=MAX_HISTORY)] = Field(
        default_factory=list
    )
    why: Text | None = None
    below: StatusPart | None = None

    @model_validator(mode="after")
    def _bounded(self) -> StatusPart:
        if _depth(self) > MAX_DEPTH:
            raise ValueError(f"status nests more than {MAX_DEPTH} levels")
        return self


class StatusQuery(_Part):
    """A master asks a child where a request it sent it stands."""

    request_id: Uuid  # the command_request's message_id as the child received it
    # How long the asker waits for the report: the child asks its own child within less.
    within: Annotated[float, Field(gt=0, le=MAX_STATUS_WAIT, allow_inf_nan=False)] | None = None


class StatusReport(StatusPart):
    """The answer to a status_query (reply_to = the query)."""

    request_id: Uuid


class CancelRequest(_Part):
    """A master tells a child to stop a request it sent it (durable, acknowledged)."""

    request_id: Uuid
    reason: Text | None = None


class CancelReport(_Part):
    """The answer to a cancel_request: the request's state after the cancel."""

    request_id: Uuid
    state: Annotated[CancelState, _only(CancelState)]
    since: IsoTimestamp | None = None
    # With an end that came up from below after an earlier cancel passed down (the state a
    # level below reached anyway): the master asks for the levels (protocol/canceling.py).
    why: Text | None = None
