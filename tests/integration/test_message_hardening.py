"""The envelope's traps closed: bounded deadlines, frozen details, checked copies, exact numbers."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.kits.agentkit import Analyst, open_peer, start_agents, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import InvalidMessage
from vox_mqtt.protocol.messages import (
    MAX_DEADLINE_SECONDS,
    MAX_EXPIRY_SECONDS,
    MSG_COMMAND_REQUEST,
    FrozenDict,
    FrozenList,
    expiry_seconds,
    new_message,
    parse,
    serialize,
    thaw_json,
)

A, B = uuid4(), uuid4()


def _request_bytes(deadline: str) -> bytes:
    return json.dumps(
        {
            "message_id": str(uuid4()),
            "message_source": "test",
            "emitted_at": "2026-01-11T08:00:00+00:00",
            "source": str(A),
            "target": str(B),
            "type": MSG_COMMAND_REQUEST,
            "details": {"command": "analyze", "params": {}, "deadline": deadline},
        }
    ).encode()


@pytest.mark.parametrize(
    "deadline",
    [
        "2200-01-01T00:00:00+00:00",  # more than 2**32 seconds away: MQTT cannot carry it
        "9999-12-31T23:59:59+00:00",
        (datetime.now(UTC) + timedelta(seconds=MAX_DEADLINE_SECONDS + 3600)).isoformat(),
    ],
    # Named, not by value: every test process must collect the same ids.
    ids=["year-2200", "year-9999", "an-hour-past-the-limit"],
)
def test_a_far_future_deadline_is_refused_at_parse_time(deadline: str) -> None:
    with pytest.raises(InvalidMessage, match=r"deadline .* is more than 30 days away"):
        parse(_request_bytes(deadline))


def test_a_deadline_in_reach_parses_and_its_expiry_is_clamped() -> None:
    soon = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    assert parse(_request_bytes(soon)).details["deadline"] == soon
    assert expiry_seconds("2200-01-01T00:00:00+00:00") == MAX_EXPIRY_SECONDS
    assert expiry_seconds("2000-01-01T00:00:00+00:00") == 1
    assert 2 * 86400 - 5 < expiry_seconds(soon) <= 2 * 86400


def test_details_are_immutable_all_the_way_down() -> None:
    details = {"command": "x", "params": {"a": {"b": [1, {"c": 2}]}, "l": [1, 2]}}
    message = new_message(MSG_COMMAND_REQUEST, source=A, target=B, details=details)
    before = serialize(message)
    params = message.details["params"]
    assert isinstance(params, FrozenDict)
    assert isinstance(params["l"], FrozenList)
    for change in (
        lambda: message.details.__setitem__("command", "y"),
        lambda: message.details.update(command="y"),
        lambda: params["a"].pop("b"),
        lambda: params["a"]["b"].append(3),
        lambda: params["a"]["b"][1].__setitem__("c", 3),
        lambda: params["l"].__setitem__(0, 9),
        lambda: params["l"].sort(),
        lambda: params["l"].__iadd__([4]),
    ):
        with pytest.raises(TypeError, match="immutable"):
            change()
    # The caller's own dict stays theirs: changing it does not reach the message.
    details["params"]["l"].append(3)
    assert serialize(message) == before
    # Copies, pickles and plain JSON all still work and say the same thing.
    assert copy.deepcopy(message) == message
    assert pickle.loads(pickle.dumps(message.details)) == message.details
    assert json.loads(before)["details"] == json.loads(json.dumps(message.details))
    thawed = thaw_json(message.details)
    thawed["params"]["l"].append(5)
    assert type(thawed["params"]) is dict
    assert message.details["params"]["l"] == [1, 2]


def test_every_changed_copy_is_validated() -> None:
    message = new_message(MSG_COMMAND_REQUEST, source=A, target=B, details={"command": "x"})
    with pytest.raises(InvalidMessage, match=r"details\.command"):
        message.model_copy(update={"details": {"params": {}}})
    with pytest.raises(InvalidMessage, match="type"):
        message.model_copy(update={"type": "Not A Type"})
    with pytest.raises(InvalidMessage, match="NaN"):
        message.model_copy(update={"details": {"command": "x", "params": {"v": float("nan")}}})
    moved = message.model_copy(update={"target": A})
    assert moved.target == A
    # Another message: two different messages never share an id (seed 003).
    assert moved.message_id != message.message_id
    assert message.model_copy(
        update={"message_id": message.message_id, "target": A}
    ) == moved.model_copy(update={"message_id": message.message_id})
    changed = message.model_copy(update={"details": {"command": "y", "params": {"k": [1]}}})
    assert isinstance(changed.details["params"]["k"], FrozenList)


def test_numbers_keep_their_json_form() -> None:
    raw = _request_bytes("2000-01-01T00:00:00+00:00").replace(
        b'"params": {}', b'"params": {"big": 1e15, "neg": -2E3, "i": 7, "f": 1.5, "huge": 1e300}'
    )
    out = serialize(parse(raw))
    assert b'"big":1000000000000000,' in out
    assert b'"neg":-2000,' in out
    assert b'"i":7,' in out
    assert b'"f":1.5,' in out
    assert b'"huge":1e+300' in out
    assert b".0," not in out
    # Integral numbers past 2**53 are not exact as doubles: they stay floats, not 300 digits.
    assert isinstance(parse(raw).details["params"]["huge"], float)
    # And a result of many 1e15 numbers no longer grows by 4.5x through a coordinator.
    result = new_message("command_result", source=A, target=B, details={"result": [1e15] * 100})
    assert b"1000000000000000.0" not in serialize(result)


@pytest.fixture
def seed(secure_broker_factory: Any) -> Any:
    return secure_broker_factory(
        tree_fleet({"root": None, "coordinator": "root", "specialist_a": "coordinator"})
    )


async def test_a_far_future_deadline_gets_a_clear_error_not_a_timeout(
    seed: Any, tmp_path: Path
) -> None:
    fleet = seed.fleet
    root_id, coord_id = fleet.root.id, fleet.agent("coordinator").id
    async with AsyncExitStack() as stack:
        agents = await start_agents(
            stack,
            seed,
            tmp_path,
            {"specialist_a": [Analyst()]},
            names=["coordinator", "specialist_a"],
        )
        await wait_for(lambda: "analyze" in agents["coordinator"].advertised_commands())
        root = await open_peer(stack, seed, "root")
        payload = json.loads(_request_bytes("2200-01-01T00:00:00+00:00"))
        payload.update(source=str(root_id), target=str(coord_id))
        payload["details"]["params"] = {"target": "x"}
        await root.session.publish(topics.inbox(coord_id, root_id), json.dumps(payload).encode())
        async with asyncio.timeout(10):
            await wait_for(lambda: root.of_type("command_error"))
        [error] = root.of_type("command_error")
        assert error.details["code"] == "INVALID_MESSAGE"
        assert (
            "deadline 2200-01-01T00:00:00+00:00 is more than 30 days away" in error.details["error"]
        )
        assert str(error.reply_to) == payload["message_id"]
