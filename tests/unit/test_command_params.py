"""What a command takes, as its advertisement carries it (docs/liveness.md, "Parameter schemas").

A handler's signature becomes a JSON schema and its docstring's first paragraph a doc line
(`roles.command_spec`), each entry bounded (`commandspec`), a master's status carries its
own entries then its children's in turns within a budget (`rules.advertised_params`), and a
watcher keeps only the entries in bounds for the commands listed (`FleetView`).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from pydantic import BaseModel

from vox_mqtt.agent.roles import Role, command, command_spec
from vox_mqtt.agent.router import Router
from vox_mqtt.agent.rules import advertised_params
from vox_mqtt.console.home.a2acard import SKILL_PARAMS, agent_card, skill_words
from vox_mqtt.observe.status import FleetView
from vox_mqtt.protocol.commandspec import (
    MAX_DOC,
    MAX_PARAMS_ENTRY,
    bounded_entry,
    canonical_size,
    first_paragraph,
    taken_params,
    within_budget,
)
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    IsoTimestamp,
    VOXMessage,
    new_message,
)


def status_message(agent: Any, *, commands: list[str], params: dict[str, Any] | None) -> VOXMessage:
    report = AgentStatus(
        name="spec",
        status="ACTIVE",
        epoch=1,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=1.0,
        commands=commands,
        params=params,
    )
    return new_message(MSG_AGENT_STATUS, source=agent, target=uuid4(), details=report)


class Window(BaseModel):
    start: int
    end: int


class Analyst(Role):
    @command
    async def analyze(self, target: str, depth: int = 2, *, window: Window | None = None) -> str:
        """Analyze a target.

        Names no one: this paragraph stays with the handler.
        """
        return target

    @command
    async def since(self, start: IsoTimestamp) -> str:
        return start

    @command
    async def loose(self, **params: Any) -> int:
        """Take anything."""
        return len(params)


def test_a_handler_signature_becomes_a_schema_without_its_role_names() -> None:
    role = Analyst()
    doc, schema = command_spec(role.get_commands()["analyze"])
    assert first_paragraph(doc) == "Analyze a target."
    assert schema is not None
    assert schema["required"] == ["target"]
    assert schema["properties"]["target"] == {"type": "string"}
    assert schema["properties"]["depth"] == {"type": "integer", "default": 2}
    assert schema["additionalProperties"] is False
    assert "Window" in schema["$defs"]  # a model's name: the handler's own type
    assert "Analyst" not in json.dumps(schema)  # never the role class
    # An annotation resolved in the handler's module (a `from __future__` string).
    _, since = command_spec(role.get_commands()["since"])
    assert since is not None
    assert since["properties"]["start"]["type"] == "string"
    # **kwargs: unknown keywords are the handler's to take.
    _, loose = command_spec(role.get_commands()["loose"])
    assert loose is not None
    assert "additionalProperties" not in loose or loose["additionalProperties"] is not False


def test_an_entry_over_its_bound_keeps_its_doc_only() -> None:
    small, dropped = bounded_entry("Do it.\n\nMore.", {"type": "object"})
    assert (small, dropped) == ({"doc": "Do it.", "schema": {"type": "object"}}, False)
    huge = {"type": "object", "properties": {f"p{i:03}": {"type": "string"} for i in range(200)}}
    entry, dropped = bounded_entry("Big.", huge)
    assert (entry, dropped) == ({"doc": "Big."}, True)
    assert len(first_paragraph("x" * 1000)) == MAX_DOC


def test_the_router_makes_each_entry_once_within_its_bound() -> None:
    router = Router()
    router.mount(Analyst())
    assert set(router.specs) == {"analyze", "since", "loose"}
    assert router.specs["analyze"]["doc"] == "Analyze a target."
    assert all(canonical_size(e) <= MAX_PARAMS_ENTRY for e in router.specs.values())


def test_a_watcher_keeps_entries_in_bounds_for_listed_commands_only() -> None:
    raw = {
        "a": {"doc": "A.", "schema": {"type": "object"}},
        "b": {"doc": "B."},
        "unlisted": {"doc": "?"},
        "bad_key": {"doc": "x", "who": "specialist-7"},
        "bad_doc": {"doc": "x" * (MAX_DOC + 1)},
        "bad_schema": {"doc": "x", "schema": []},
        "too_big": {"doc": "x", "schema": {"enum": ["y" * MAX_PARAMS_ENTRY]}},
        "not_a_dict": "analyze",
    }
    listed = ["a", "b", "bad_key", "bad_doc", "bad_schema", "too_big", "not_a_dict"]
    assert taken_params(raw, listed) == {"a": raw["a"], "b": raw["b"]}
    assert taken_params(["a"], listed) == {}
    assert taken_params(None, listed) == {}


def test_a_master_carries_its_own_entries_first_then_its_childrens_in_turns() -> None:
    own = {"mine": {"doc": "Mine.", "schema": {"type": "object"}}}
    first, second = sorted([uuid4(), uuid4()])
    children = {
        first: {f"a{i}": {"doc": "A", "schema": {"enum": ["x" * 500]}} for i in range(4)},
        second: {"b0": {"doc": "B", "schema": {"enum": ["y" * 500]}}, "mine": {"doc": "theirs"}},
    }
    chosen = ["mine", "a0", "a1", "a2", "a3", "b0"]
    everything, cut = advertised_params(chosen, own, children)
    assert cut == 0
    assert everything["mine"] == own["mine"]  # its own, not a child's, for its own command
    assert set(everything) == set(chosen)
    # A budget for four entries of the children: the second child's comes in the first turn.
    kept, cut = advertised_params(chosen, own, children, budget=1700)
    assert "schema" in kept["b0"], kept
    assert "schema" in kept["a0"], kept
    assert "schema" in kept["a1"], kept
    assert kept["a2"] == {"doc": "A"}, kept  # its doc alone fits
    assert ("a3" not in kept, cut) == (True, 2), kept  # nor does that: not carried
    assert advertised_params(["a0"], own, children)[0] == {"a0": children[first]["a0"]}


def test_within_budget_carries_a_doc_alone_then_nothing() -> None:
    entries = [("x", {"doc": "X" * 50, "schema": {"enum": ["z" * 100]}})] * 2
    kept, cut = within_budget([*entries, ("y", {"doc": "Y" * 50})], budget=80)
    assert kept == {"x": {"doc": "X" * 50}}
    assert cut == 2


def test_a_status_with_params_is_taken_and_one_without_is_still_valid() -> None:
    agent = uuid4()
    view = FleetView()
    params = {"echo": {"doc": "Echo.", "schema": {"type": "object"}}, "gone": {"doc": "?"}}
    view.update(status_message(agent, commands=["echo"], params=params))
    entry = view.get(agent)
    assert entry is not None
    assert entry.params == {"echo": params["echo"]}
    assert entry.as_dict()["params"] == {"echo": params["echo"]}
    older = AgentStatus.model_validate(
        {"name": "a", "epoch": 1, "started_at": "2026-01-01T00:00:00+00:00",
         "heartbeat_interval": 1.0, "commands": ["echo"]}
    )  # fmt: skip
    assert older.params is None
    # A watcher of an older version (no such field) takes it as an extra: the model allows.
    assert AgentStatus.model_config.get("extra") == "allow"


def test_the_card_says_each_skills_params_in_words_and_in_its_extension() -> None:
    skills = {
        "echo": {"doc": "Echo.", "schema": {"type": "object", "properties": {
            "text": {"type": "string"}}, "required": ["text"]}},
        "old": {},
    }  # fmt: skip
    card = agent_card("root", "http://h/", skills, token=False)
    (extension,) = card.capabilities.extensions
    assert extension.uri == SKILL_PARAMS
    assert dict(extension.params["skills"]) == {"echo": skills["echo"]["schema"]}
    assert [s.id for s in card.skills] == ["echo", "old"]
    assert "text (string, required)" in skill_words("echo", skills["echo"])
    assert skill_words("old", {}).startswith("The fleet's `old` command.")
