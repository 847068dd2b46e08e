"""The router: which mounted role serves each command and handles each event."""

from __future__ import annotations

import logging
from typing import Any

from vox_mqtt.agent.roles import Handler, Role, command_spec
from vox_mqtt.protocol.commandspec import MAX_PARAMS_ENTRY, bounded_entry

log = logging.getLogger(__name__)

__all__ = ["Router"]


class Router:
    """Every route name -> the roles that serve it, with commands and events kept apart."""

    def __init__(self) -> None:
        self.roles: list[Role] = []
        self.routes: dict[str, list[Role]] = {}  # the seed's router: route -> roles
        self.commands: set[str] = set()
        self.events: set[str] = set()
        # Each command's advertised entry ({"doc", "schema"}), made once when it is mounted.
        self.specs: dict[str, dict[str, Any]] = {}

    def mount(self, role: Role) -> None:
        """Add a role: its commands and events join the routes."""
        self.roles.append(role)
        for route in role.routes():
            self._add_route(role, route)
        role.watch_routes(self._add_route)

    def _add_route(self, role: Role, route: str) -> None:
        """Route one command or event to a role (at mount, or when the role gains one)."""
        if route in role.get_commands():
            self.commands.add(route)
            if route not in self.specs:
                self.specs[route] = _entry(route, role.get_commands()[route])
        elif route in self.commands:
            raise ValueError(f"{route!r} is a command here; it cannot also be an event")
        else:
            self.events.add(route)
        serving = self.routes.setdefault(route, [])
        if role not in serving:
            serving.append(role)

    def command_handler(self, name: str) -> Handler | None:
        """Return the handler of a command served here, or None (then it is delegated)."""
        if name not in self.commands:
            return None
        for role in self.routes.get(name, []):
            handler = role.get_commands().get(name)
            if handler is not None:
                return handler
        return None

    def event_handlers(self, message_type: str) -> list[Handler]:
        """Return the handlers of an event type; a command's name is never an event."""
        if message_type in self.commands:
            return []
        roles = self.routes.get(message_type, [])
        return [handler for role in roles for handler in role.handlers_for(message_type)]


def _entry(command: str, handler: Handler) -> dict[str, Any]:
    """Return a command's advertised entry; a schema over the bound is left out, said once."""
    doc, schema = command_spec(handler)
    entry, dropped = bounded_entry(doc, schema)
    if dropped:
        log.warning(
            "command %r: its parameters' schema is over %d bytes: advertised with its doc only",
            command,
            MAX_PARAMS_ENTRY,
        )
    return entry
