"""Roles, @command, on(): what the router sees and how params are checked."""

from __future__ import annotations

from typing import Any

import pytest

from vox_mqtt.agent.roles import Role, command, expected_params, load_role, on
from vox_mqtt.agent.router import Router
from vox_mqtt.protocol.errors import ConfigError, InvalidParams


class Analyst(Role):
    @command
    async def analyze(self, target: str, depth: int = 1) -> dict[str, Any]:
        return {"target": target, "depth": depth}

    @command("count-words")
    def count(self, text: str) -> int:
        return len(text.split())

    @on("job_detected")
    async def seen(self, message: Any) -> None:
        self.last = message


async def test_commands_are_named_by_method_or_explicitly() -> None:
    role = Analyst()
    assert set(role.get_commands()) == {"analyze", "count-words"}
    assert set(role.routes()) == {"analyze", "count-words", "job_detected"}


async def test_params_arrive_as_keyword_arguments() -> None:
    role = Analyst()
    assert await role.get_commands()["analyze"](target="x", depth=2) == {"target": "x", "depth": 2}
    assert await role.get_commands()["count-words"](text="a b c") == 3


@pytest.mark.parametrize(
    ("params", "line"),
    [
        ({}, "parameter 'target' is missing (expected a string)"),
        ({"target": 5}, "parameter 'target' should be a valid string, not 5"),
        (
            {"target": "x", "depth": "deep"},
            "parameter 'depth' should be a valid integer, unable to parse string as an "
            "integer, not 'deep'",
        ),
        (
            {"target": "x", "unknown": 1},
            "unexpected parameter 'unknown': analyze takes target (a string), depth (an integer)",
        ),
    ],
)
async def test_params_that_do_not_fit_the_signature_are_one_line_naming_the_parameter(
    params: dict[str, Any], line: str
) -> None:
    role = Analyst()
    with pytest.raises(InvalidParams) as refused:
        await role.get_commands()["analyze"](**params)
    assert str(refused.value) == line
    # The role class never shows: the line travels up the tree to the operator.
    assert "Analyst" not in line
    assert not hasattr(role, "ran")


def test_expected_params_say_what_each_parameter_takes() -> None:
    assert expected_params(Analyst().analyze) == {"target": "a string", "depth": "an integer"}


async def test_role_on_registers_an_instance_handler() -> None:
    role = Analyst()

    @role.on("data_request")
    async def handle(message: Any) -> None:
        pass

    assert role.handlers_for("data_request") == [handle]


def test_subclass_inherits_and_extends_commands() -> None:
    class Deep(Analyst):
        @command
        async def deeper(self) -> str:
            return "ok"

    assert set(Deep().get_commands()) == {"analyze", "count-words", "deeper"}
    assert set(Analyst().get_commands()) == {"analyze", "count-words"}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nocolon", "write it as 'module:Class'"),
        ("no_such_module_x:Role", "cannot import"),
        ("tests.unit.test_roles:Nope", "is not a vox_mqtt Role"),
        ("tests.unit.test_roles:command", "is not a vox_mqtt Role"),
    ],
)
def test_load_role_errors_are_readable(spec: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_role(spec)


def test_load_role_passes_settings() -> None:
    role = load_role("tests.unit.test_roles:Analyst", {"k": 1})
    assert isinstance(role, Analyst)
    assert role.settings == {"k": 1}


def test_public_api_names_the_runtime() -> None:
    import vox_mqtt

    assert vox_mqtt.Role is Role
    assert vox_mqtt.command is command
    for name in ("VOXAgent", "AgentConfig", "OperatorConsole", "VOXAgentMemory", "BrokerSettings"):
        assert name in vox_mqtt.__all__
        assert getattr(vox_mqtt, name) is not None


def test_router_keeps_commands_and_events_apart() -> None:
    role = Analyst()
    router = Router()
    router.mount(role)
    assert router.commands == {"analyze", "count-words"}
    assert router.events == {"job_detected"}
    assert router.command_handler("analyze") is not None
    assert router.command_handler("job_detected") is None
    assert router.event_handlers("analyze") == []  # a command's name is never an event
    assert len(router.event_handlers("job_detected")) == 1
