"""Roles: groups of `@command` handlers and `on(event)` handlers an agent serves."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Protocol,
    TypeVar,
    get_type_hints,
    overload,
)
from uuid import UUID

from pydantic import BaseModel, PydanticUserError, TypeAdapter, ValidationError, validate_call

from vox_mqtt.protocol.errors import ConfigError, InvalidParams
from vox_mqtt.protocol.validation import describe_params, type_words

if TYPE_CHECKING:
    from vox_mqtt.agent.tracking import TrackedRequest
    from vox_mqtt.ledger.store import VOXAgentMemory
    from vox_mqtt.protocol.messages import VOXMessage
    from vox_mqtt.protocol.settings import AgentConfig

__all__ = [
    "AgentHandle",
    "Handler",
    "Role",
    "command",
    "command_spec",
    "expected_params",
    "is_idempotent",
    "load_role",
    "on",
]

F = TypeVar("F", bound=Callable[..., Any])
EventHandler = Callable[["VOXMessage"], Awaitable[Any]]
Handler = Callable[..., Awaitable[Any]]


class AgentHandle(Protocol):
    """What a role may use of the agent it is mounted on: its identity, ledger and mail."""

    @property
    def id(self) -> UUID: ...
    @property
    def name(self) -> str: ...
    @property
    def config(self) -> AgentConfig: ...
    @property
    def ledger(self) -> VOXAgentMemory: ...
    @property
    def memory(self) -> VOXAgentMemory: ...

    async def send(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        reply_to: UUID | None = None,
        message_source: str | None = None,
    ) -> TrackedRequest: ...
    async def send_message(self, message: VOXMessage, *, expects_reply: bool) -> TrackedRequest: ...
    async def request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage: ...
    async def ask(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        timeout: float | None = None,
        reply_to: UUID | None = None,
    ) -> VOXMessage: ...
    async def reply(
        self, message: VOXMessage, type: str, details: dict[str, Any] | BaseModel
    ) -> TrackedRequest: ...
    async def notify_master(
        self, type: str, details: dict[str, Any] | BaseModel, *, message_source: str | None = None
    ) -> TrackedRequest: ...
    async def raise_incident(
        self,
        error_code: str,
        description: str,
        *,
        severity: Literal["CRITICAL", "ERROR", "WARNING", "INFO"] = "ERROR",
    ) -> bool: ...
    async def resolve_incident(self, error_code: str, description: str) -> bool: ...
    # A request's life (agent/lifecycle.py, docs/messages.md): in a handler, its progress;
    # as a master, where a request it sent stands, its cancel, its transitions.
    async def progress(self, fraction: float | None = None, text: str | None = None) -> None: ...
    async def request_status(
        self, request_id: UUID, *, timeout: float | None = None
    ) -> dict[str, Any]: ...
    async def cancel(
        self, request_id: UUID, *, reason: str | None = None, timeout: float | None = None
    ) -> dict[str, Any]: ...
    def follow(self, request_id: UUID) -> AsyncIterator[dict[str, Any]]: ...


_COMMAND_MARK = "__vox_command__"
_TARGET_MARK = "__vox_target__"  # the method a validated handler calls (its signature, doc)
_EVENT_MARK = "__vox_events__"
IDEMPOTENT_MARK = "__vox_idempotent__"


@overload
def command(name: F) -> F: ...
@overload
def command(name: str | None = None, *, idempotent: bool = False) -> Callable[[F], F]: ...
def command(name: str | F | None = None, *, idempotent: bool = False) -> F | Callable[[F], F]:
    """Mark a role method as a command, named after the method or explicitly.

    idempotent=True says that running it twice does no harm: its handler may then start
    while its record commits, and a quick answer commits with that record and stands for
    its acknowledgement (docs/ledger.md, rows that commit together).
    """

    def mark(func: F, command_name: str | None) -> F:
        if not inspect.iscoroutinefunction(func) and not inspect.isfunction(func):
            raise TypeError(f"@command needs a function, not {func!r}")
        setattr(func, _COMMAND_MARK, command_name or func.__name__)
        setattr(func, IDEMPOTENT_MARK, idempotent)
        return func

    if callable(name):
        return mark(name, None)
    return lambda func: mark(func, name)


def is_idempotent(handler: Handler) -> bool:
    """Tell whether a command handler was declared idempotent (@command(idempotent=True))."""
    return getattr(handler, IDEMPOTENT_MARK, False) is True


def on(event: str) -> Callable[[F], F]:
    """Mark a role method as the handler of an event type (e.g. "job_detected")."""

    def mark(func: F) -> F:
        events: tuple[str, ...] = getattr(func, _EVENT_MARK, ())
        setattr(func, _EVENT_MARK, (*events, event))
        return func

    return mark


class Role:
    """A set of commands and event handlers, mounted on an agent by the daemon."""

    # Commands and events declared in the class body, by name -> method name.
    _declared_commands: ClassVar[dict[str, str]] = {}
    _declared_events: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        commands: dict[str, str] = {}
        events: dict[str, tuple[str, ...]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                name = getattr(value, _COMMAND_MARK, None)
                if name is not None:
                    commands[name] = attr
                for event in getattr(value, _EVENT_MARK, ()):
                    events[event] = (*events.get(event, ()), attr)
        cls._declared_commands = commands
        cls._declared_events = events

    def __init__(self, *, settings: Mapping[str, Any] | None = None) -> None:
        self.settings: Mapping[str, Any] = settings or {}
        self._agent: AgentHandle | None = None
        # Set by the router that mounted this role: told of every route added later.
        self._route_added: Callable[[Role, str], None] | None = None
        # The seed's router contract: every route (command or event) -> handler.
        self._handlers: dict[str, list[Handler]] = {}
        self._commands: dict[str, Handler] = {}
        for name, attr in self._declared_commands.items():
            handler = _validated(getattr(self, attr), name)
            self._commands[name] = handler
            self._handlers[name] = [handler]
        for event, attrs in self._declared_events.items():
            for attr in attrs:
                self._handlers.setdefault(event, []).append(getattr(self, attr))

    @property
    def name(self) -> str:
        """Return the role's name (its class name)."""
        return type(self).__name__

    @property
    def agent(self) -> AgentHandle:
        """Return the agent this role is mounted on."""
        if self._agent is None:
            raise RuntimeError(f"role {self.name} is not mounted on an agent yet")
        return self._agent

    def bind(self, agent: AgentHandle) -> None:
        """Mount the role on an agent (called by the agent)."""
        self._agent = agent

    def get_commands(self) -> dict[str, Handler]:
        """Return the commands this role serves, by name."""
        return dict(self._commands)

    def routes(self) -> list[str]:
        """Return every route (command or event) this role has a handler for."""
        return list(self._handlers)

    def handlers_for(self, route: str) -> list[Handler]:
        """Return the handlers of one route, in registration order."""
        return list(self._handlers.get(route, ()))

    def on(self, event: str) -> Callable[[EventHandler], EventHandler]:
        """Register a function as a handler of an event type on this role instance.

        Before or after mounting: once mounted, the agent routes the event at once.
        """
        if event in self._commands:
            raise ValueError(f"{event!r} is a command of role {self.name}, not an event")

        def register(func: EventHandler) -> EventHandler:
            self._handlers.setdefault(event, []).append(func)
            if self._route_added is not None:
                self._route_added(self, event)
            return func

        return register

    def watch_routes(self, added: Callable[[Role, str], None]) -> None:
        """Be told of each route this role gains after mounting (called by the router)."""
        self._route_added = added

    async def start(self) -> None:
        """Run when the agent has connected; override to start work."""

    async def run(self) -> None:
        """Run in the background for the agent's lifetime; override for watchers."""

    async def stop(self) -> None:
        """Run when the agent stops; override to release resources."""


def _validated(method: Callable[..., Any], command_name: str) -> Callable[..., Awaitable[Any]]:
    """Wrap a command so its keyword params are validated against its signature first.

    Params that do not fit are the operator's mistake: `InvalidParams`, one line naming the
    command and the parameter (never the role class: the line travels up the tree), raised
    before the handler's body runs (docs/messages.md, INVALID_PARAMS).
    """
    checked = validate_call(method)

    async def call(**params: Any) -> Any:
        # For coroutine functions pydantic validates when the coroutine starts, so
        # both the call and the await can raise the validation error.
        try:
            outcome = checked(**params)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except ValidationError as exc:
            if exc.title != getattr(method, "__qualname__", exc.title):
                raise  # a model validated inside the handler: a handler error, not bad params
            errors = exc.errors(include_url=False)
            raise InvalidParams(
                describe_params(command_name, errors, expected_params(method))
            ) from None
        return outcome

    call.__name__ = getattr(method, "__name__", command_name)
    setattr(call, _TARGET_MARK, method)
    setattr(call, IDEMPOTENT_MARK, getattr(method, IDEMPOTENT_MARK, False))
    return call


def expected_params(method: Callable[..., Any]) -> dict[str, str]:
    """Return each keyword parameter of a command -> what it takes, in words ("a string")."""
    try:
        hints = get_type_hints(method, include_extras=True)
    except (NameError, TypeError):
        hints = {}  # an annotation that cannot be resolved: the names alone still help
    expected: dict[str, str] = {}
    for name, param in inspect.signature(method).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        try:
            schema = TypeAdapter(hints.get(name, Any)).json_schema()
        except (PydanticUserError, TypeError, ValueError):
            schema = {}
        expected[name] = type_words(schema)
    return expected


def command_spec(handler: Handler) -> tuple[str, dict[str, Any] | None]:
    """Return a command handler's docstring and the JSON schema of its keyword parameters.

    The schema is pydantic's for the signature it is validated against (INVALID_PARAMS),
    without titles (the role's or method's name never rises: docs/broker.md); unknown
    keywords are refused unless it takes **kwargs. None when no schema can be made.
    """
    method = getattr(handler, _TARGET_MARK, handler)
    doc = inspect.getdoc(method) or ""
    try:
        # Resolved here, in the handler's own module (pydantic would look in ours).
        hints = get_type_hints(method, include_extras=True)
        signature = inspect.signature(method)
        resolved = [
            p.replace(annotation=hints.get(n, Any)) for n, p in signature.parameters.items()
        ]

        def proxy(*args: Any, **kwargs: Any) -> Any: ...

        proxy.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=resolved, return_annotation=Any
        )
        proxy.__annotations__ = {p.name: p.annotation for p in resolved}
        schema = TypeAdapter[Any](proxy).json_schema()  # type: ignore[arg-type]
    except (PydanticUserError, TypeError, ValueError, NameError):
        return doc, None
    schema.pop("title", None)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for value in properties.values():
            if isinstance(value, dict):
                value.pop("title", None)
    if all(p.kind != p.VAR_KEYWORD for p in resolved):
        schema["additionalProperties"] = False
    schema.setdefault("type", "object")
    return doc, schema


def load_role(spec: str, settings: Mapping[str, Any] | None = None) -> Role:
    """Import `module:Class` and instantiate the role; raise ConfigError on any problem."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError([f"role {spec!r}: write it as 'module:Class'"])
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError([f"role {spec!r}: cannot import {module_name!r}: {exc}"]) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Role)):
        raise ConfigError([f"role {spec!r}: {module_name}.{class_name} is not a vox_mqtt Role"])
    try:
        return cls(settings=settings or {})
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError([f"role {spec!r}: invalid settings: {exc}"]) from None
