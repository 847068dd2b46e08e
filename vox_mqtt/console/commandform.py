"""The send form's commands (docs/web.md): what the root says of each one's parameters, and
whether given params fit them, the same check the page makes before it sends.

A root may advertise, beside its command names, each command's parameters as a JSON schema
and a doc line (`params` in its status: `{command: {"doc": str, "schema": {...}}}`). When it
does, the form shows each parameter (name, type, required) and both the page and the server
check the required and typed fields before sending; when it does not, params are raw JSON,
checked by the root alone. Only the part of JSON Schema a form can show is read: an
object's `properties` (each with its `type`, `description`, `default`) and `required`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_SPECS", "command_specs", "params_of_status", "params_problem"]

MAX_SPECS: Final = 256  # commands whose parameters are kept for one root
_MAX_FIELDS: Final = 64
_TYPES: Final = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})


def params_of_status(payload: bytes) -> dict[str, Any] | None:
    """Return the `params` a status message carries (None when it carries none).

    Read from the message as sent: the observer keeps no such field (docs/web.md).
    """
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    details = message.get("details") if isinstance(message, dict) else None
    params = details.get("params") if isinstance(details, dict) else None
    return params if isinstance(params, dict) else None


def _type_of(spec: Mapping[str, Any]) -> str | None:
    kind = spec.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) and kind in _TYPES else None


def command_specs(params: Mapping[str, Any] | None, commands: list[str]) -> dict[str, Any]:
    """Return, for each advertised command the root describes, its doc and fields.

    A field is {name, type (None: any), required, doc, default}; anything the form cannot
    read is left out, so a root's odd schema costs the form its fields, never the page.
    """
    out: dict[str, Any] = {}
    for command in commands[:MAX_SPECS]:
        entry = (params or {}).get(command)
        if not isinstance(entry, Mapping):
            continue
        doc = entry.get("doc")
        schema = entry.get("schema")
        fields = []
        if isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping):
            required = schema.get("required")
            needed = set(required) if isinstance(required, list) else set()
            for name, spec in list(schema["properties"].items())[:_MAX_FIELDS]:
                spec = spec if isinstance(spec, Mapping) else {}
                text = spec.get("description") or spec.get("title")
                fields.append(
                    {
                        "name": str(name),
                        "type": _type_of(spec),
                        "required": name in needed,
                        "doc": text if isinstance(text, str) else None,
                        "default": spec.get("default"),
                    }
                )
        out[command] = {"doc": doc if isinstance(doc, str) else None, "fields": fields}
    return out


def _fits(value: Any, kind: str | None) -> bool:
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    checks: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "boolean": bool,
        "array": list,
        "object": dict,
        "null": type(None),
    }
    return isinstance(value, checks[kind])


def params_problem(spec: Mapping[str, Any] | None, params: Mapping[str, Any]) -> str | None:
    """Return why params do not fit a command's fields (one line), or None when they do.

    spec is one command of `command_specs` (None: nothing known, anything goes).
    """
    if spec is None:
        return None
    for field in spec.get("fields", []):
        name = field["name"]
        if name not in params:
            if field["required"]:
                return f"{name} is required"
            continue
        kind = field["type"]
        if not _fits(params[name], kind):
            article = "an" if kind in ("integer", "array", "object") else "a"
            return f"{name} must be {article} {kind}"
    return None
