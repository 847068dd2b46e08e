"""Frozen JSON values: the dict and list a message's details are made of, immutable and exact."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, NoReturn

__all__ = ["MAX_EXACT_INT", "FrozenDict", "FrozenList", "freeze_json", "thaw_json"]

# Integers up to 2**53 are exact as doubles, so JSON readers everywhere agree on them.
MAX_EXACT_INT: Final = 2**53


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable: build a new message instead")


class FrozenDict(dict[str, Any]):
    """A dict that refuses every change; it still serializes as a JSON object."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        # copy and pickle would otherwise rebuild it item by item through __setitem__.
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A list that refuses every change; it still serializes as a JSON array."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def _number(value: float) -> float | int:
    if not math.isfinite(value):
        # JSON has no NaN or Infinity; pydantic reads them (and 1e400) as floats and would
        # write them back as null, silently changing what the sender said.
        raise ValueError("NaN and Infinity are not JSON numbers")
    if value.is_integer() and abs(value) < MAX_EXACT_INT:
        # JSON has one number type: 1e15 is the integer 10**15, and written back as a float
        # it would come out as 1000000000000000.0 (see docs/messages.md, "Numbers").
        return int(value)
    return value


# Values kept as they are: JSON's scalars and what is already frozen (checked when built).
_KEPT: Final = frozenset({str, int, bool, type(None)})
_FROZEN: Final = frozenset({FrozenDict, FrozenList})
_AS_IS: Final = _KEPT | _FROZEN
_NUMBERS: Final = frozenset({int, float})


def freeze_json(value: Any) -> Any:
    """Return value with every dict and list frozen, floats checked and integral ones as ints."""
    kind = type(value)
    # What a JSON parser makes (dict, list, the scalars) is told apart by its exact type:
    # a status's details hold hundreds of numbers, taken at every heartbeat.
    if kind is dict:
        return _freeze_dict(value)
    if kind is list:
        return _freeze_list(value)
    if kind is float:
        return _number(value)
    if kind in _AS_IS:
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, FrozenDict | FrozenList | str | int | None):
        # A frozen container was checked when it was built, and it cannot have changed since.
        return value
    if isinstance(value, Mapping):
        return _freeze_dict(value)
    if isinstance(value, list | tuple):
        return _freeze_list(value)
    return value


def _freeze_dict(value: Mapping[Any, Any]) -> FrozenDict:
    frozen: dict[str, Any] = {}
    for key, item in value.items():
        kind = type(item)
        if kind is float:
            item = _number(item)
        elif kind not in _AS_IS:
            item = freeze_json(item)
        frozen[key if type(key) is str else str(key)] = item
    return FrozenDict(frozen)


def _freeze_list(value: list[Any] | tuple[Any, ...]) -> FrozenList:
    kinds = set(map(type, value))
    if kinds <= _KEPT:  # a list of counts or names: nothing in it changes
        return FrozenList(value)
    if kinds <= _NUMBERS and all(map(math.isfinite, value)):  # bucket bounds, readings
        return FrozenList(
            [
                int(item)
                if type(item) is float and item.is_integer() and abs(item) < MAX_EXACT_INT
                else item
                for item in value
            ]
        )
    return FrozenList(
        [_number(item) if type(item) is float else freeze_json(item) for item in value]
    )


def thaw_json(value: Any) -> Any:
    """Return a plain, mutable copy of a frozen JSON value."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw_json(v) for v in value]
    return value
