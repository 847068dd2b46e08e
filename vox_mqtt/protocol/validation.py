"""A pydantic validation error as one line a person can act on (docs/messages.md, parsing)."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["describe"]


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
