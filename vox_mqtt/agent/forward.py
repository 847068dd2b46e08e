"""A facade's method that is its part's own: declared once, on the part, and forwarded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

__all__ = ["Forward"]

P = ParamSpec("P")
R = TypeVar("R")


class Forward(Generic[P, R]):
    """`send = Forward("_outbox", Outbox.send)`: `agent.send` is `agent._outbox.send`.

    The signature and docstring are the part's, so the facade cannot drift from it.
    """

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, owner_obj: None, owner: type[Any]) -> Forward[P, R]: ...
    @overload
    def __get__(self, owner_obj: object, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, owner_obj: object | None, owner: type[Any]) -> Any:
        if owner_obj is None:
            return self
        return getattr(getattr(owner_obj, self._part), self._name)
