"""The A2A door's agent card: one skill per command the root advertises (docs/a2a.md).

A2A v1.0's `AgentSkill` has no field for an input schema, so each skill's parameters go
two ways: in the skill's own words (its description names them, its example is a data
part), and whole, as JSON schemas, in a data-only extension the card declares
(`SKILL_PARAMS`, the spec's extension mechanism: `capabilities.extensions`, not required).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

__all__ = ["SKILL_PARAMS", "agent_card", "skill_words"]

# The data-only extension: params {"skills": {skill id: the handler's JSON schema}}.
SKILL_PARAMS: Final = "urn:vox-mqtt:a2a:skill-params:v1"


def skill_words(command: str, entry: Mapping[str, Any]) -> str:
    """Return a skill's description: its doc, its parameters in words, how to send it."""
    words = [str(entry.get("doc") or f"The fleet's `{command}` command.")]
    schema = entry.get("schema")
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        required = set(schema.get("required") or ())
        named = []
        for name, spec in schema["properties"].items():
            kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
            named.append(f"{name} ({kind}{', required' if name in required else ''})")
        words.append("Parameters: " + (", ".join(named) or "none") + ".")
    words.append(
        f'Send a data part {{"command": "{command}", "params": {{...}}}} or the text '
        f'"{command} key=value".'
    )
    return " ".join(words)


def _example(command: str, entry: Mapping[str, Any]) -> str:
    schema = entry.get("schema")
    required = schema.get("required") if isinstance(schema, dict) else None
    params = {name: "..." for name in required or ()}
    return json.dumps({"command": command, "params": params})


def agent_card(
    name: str, url: str, skills: Mapping[str, Mapping[str, Any]], *, token: bool
) -> AgentCard:
    """Return the card: one skill per command the root advertises, streaming, the scheme.

    `skills`: each command -> what it takes ({"doc", "schema"}, as the root's status said).
    """
    schemas = {
        command: dict(entry["schema"])
        for command, entry in skills.items()
        if isinstance(entry.get("schema"), dict)
    }
    extension = AgentExtension(
        uri=SKILL_PARAMS,
        description=(
            "params.skills: each skill id -> the JSON schema of the params object its data "
            "part takes (the handler's keyword arguments); a skill without one is not known"
        ),
        required=False,
    )
    extension.params.update({"skills": schemas})
    card = AgentCard(
        name=name,
        description=f"The vox-mqtt fleet under {name}, through its operator's console",
        version="1.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=f"{url}rest", protocol_binding="HTTP+JSON", protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=False, extensions=[extension]
        ),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(
                id=command,
                name=command,
                description=skill_words(command, entry),
                tags=["vox-command"],
                examples=[_example(command, entry)],
            )
            for command, entry in sorted(skills.items())
        ],
    )
    if token:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))
        )
        card.security_requirements.append(
            SecurityRequirement(schemes={"bearer": StringList(list=[])})
        )
    return card
