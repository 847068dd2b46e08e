"""The A2A door's pure parts (console/home/a2a.py): messages read as commands, codes as states."""

from __future__ import annotations

import pytest
from a2a.types import TaskState

from vox_mqtt.console.home.a2a import parse_message, task_state_of


def test_a_data_part_or_a_text_part_is_a_command() -> None:
    data = [{"data": {"command": "echo", "params": {"text": "hi"}}}]
    assert parse_message(data, ["echo"]) == ("echo", {"text": "hi"})
    assert parse_message([{"data": {"command": "echo"}}], []) == ("echo", {})
    text = [{"text": "steps count=3 pause=0.5 name='two words' tag=x"}]
    found = parse_message(text, [])
    assert found == ("steps", {"count": 3, "pause": 0.5, "name": "two words", "tag": "x"})


@pytest.mark.parametrize(
    "parts",
    [[], [{"data": {"what": 1}}], [{"text": "   "}], [{"text": "echo oops"}],
     [{"data": {"command": "echo", "params": [1]}}], [{"text": "echo 'open"}]],
)  # fmt: skip
def test_anything_else_is_refused_naming_the_skills(parts: list[dict[str, object]]) -> None:
    with pytest.raises(ValueError, match=r"skills: echo|params is an object|does not parse"):
        parse_message(parts, ["echo"])


def test_codes_map_to_task_states() -> None:
    assert task_state_of("CANCELED") == TaskState.TASK_STATE_CANCELED
    assert task_state_of("NO_ROUTE") == TaskState.TASK_STATE_REJECTED
    assert task_state_of("UNAUTHORIZED_SOURCE") == TaskState.TASK_STATE_REJECTED
    assert task_state_of("HANDLER_ERROR") == TaskState.TASK_STATE_FAILED
    assert task_state_of("TIMEOUT") == TaskState.TASK_STATE_FAILED
