"""A pydantic validation error as one line a person can act on (docs/messages.md, parsing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

__all__ = ["describe", "describe_params", "type_words"]


PLAIN_REASONS = {
    "missing": "missing (required)",
    "extra_forbidden": "unexpected field (the envelope is fixed; payload goes in details)",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
}


def describe(exc: ValidationError, *, within: str = "") -> str:
    """Turn pydantic's errors into one line a person can act on."""
    problems = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in (within, *error["loc"]) if part != "")
        kind = error["type"]
        if kind == "json_invalid":
            problems.append(f"not valid JSON ({error['msg'].removeprefix('Invalid JSON: ')})")
            continue
        if kind == "value_error":
            reason = str(error.get("ctx", {}).get("error", error["msg"]))
        else:
            reason = PLAIN_REASONS.get(kind, error["msg"])
        if not where:
            problems.append("message " + reason if kind in PLAIN_REASONS else reason)
        else:
            problems.append(f"{where}: {reason}")
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


# What a parameter's type asks for, in words, by its JSON-schema type (describe_params).
TYPE_WORDS: Final = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def type_words(schema: Mapping[str, Any]) -> str:
    """Say in words what a JSON schema asks for ("a string", "an integer or null")."""
    if "anyOf" in schema:
        words = [type_words(part) for part in schema["anyOf"]]
        return " or ".join(dict.fromkeys(w for w in words if w))
    kind = schema.get("type")
    if isinstance(kind, str):
        return TYPE_WORDS.get(kind, kind)
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    return "a value"


def _where(loc: Sequence[int | str]) -> str:
    """Return a parameter's place: its name, then [index] or .key within it."""
    head, *rest = loc
    return str(head) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_params(
    command: str, errors: Sequence[Mapping[str, Any]], expected: Mapping[str, str]
) -> str:
    """Return one line saying which parameter does not fit a command, and what it expects.

    errors: pydantic's error dicts for the call's keyword params; expected: each parameter's
    name -> what it takes in words (`type_words`). Names the command, never the role or
    agent that serves it: the line travels up the tree to the operator (INVALID_PARAMS,
    docs/messages.md).
    """
    problems = []
    for error in errors[:3]:
        loc = [p for p in error.get("loc", ()) if isinstance(p, int | str)]
        kind = str(error.get("type", ""))
        if not loc:
            problems.append(str(error.get("msg", "params do not fit")))
            continue
        name, where = str(loc[0]), _where(loc)
        wants = expected.get(name)
        if kind in ("missing_argument", "missing", "missing_keyword_only_argument"):
            problems.append(
                f"parameter {where!r} is missing" + (f" (expected {wants})" if wants else "")
            )
        elif kind == "unexpected_keyword_argument":
            takes = ", ".join(f"{p} ({w})" for p, w in expected.items()) or "no parameters"
            problems.append(f"unexpected parameter {where!r}: {command} takes {takes}")
        elif kind == "value_error":
            reason = error.get("ctx", {}).get("error", error.get("msg", ""))
            problems.append(f"parameter {where!r}: {reason}")
        else:
            # Pydantic's "Input should be a valid integer": the parameter, then what it got.
            msg = str(error.get("msg", "")).removeprefix("Input ")
            got = _shown(error.get("input"))
            problems.append(f"parameter {where!r} {msg}, not {got}")
    more = len(errors) - len(problems)
    # The answer carries the command's name already (CommandError.command): not repeated.
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
