"""Property tests: whatever a peer publishes, the agent records a verdict and keeps serving."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kits.agentkit import JOB, Peer, open_peer, start_agents, wait_for
from tests.kits.brokerkit import tree_fleet
from vox_mqtt.agent.budget import REFUSAL_BUDGET
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_JOB_DETECTED
from vox_mqtt.protocol.messages import MSG_ACKNOWLEDGED, new_message, serialize

TREE = {"root": None, "coordinator": "root", "specialist_a": "coordinator"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
TYPES = [
    "command_request",
    "command_result",
    "command_error",
    "message_acknowledged",
    "job_detected",
    "data_request",
    "data_response",
    "system_failure",
    "agent_status",
    "brand_new_type",
]


class Fuzzed:
    """The coordinator under test and the specialist's raw session that feeds it."""

    def __init__(self, coordinator: VOXAgent, peer: Peer, coord_id: UUID, spec_id: UUID):
        self.coordinator, self.peer = coordinator, peer
        self.coord_id, self.spec_id = coord_id, spec_id

    async def feed(self, payload: bytes) -> None:
        await self.peer.session.publish(topics.inbox(self.coord_id, self.spec_id), payload)

    async def last_row(self) -> int:
        rows = await self.coordinator.memory.get_recent(1)
        return int(rows[0]["id"]) if rows else 0

    async def verdicts(self) -> tuple[int, int]:
        """The last ledger row, and the refusals beyond the peer's budget (counted, no row)."""
        return await self.last_row(), self.coordinator.metrics.unrecorded.total()

    async def feed_and_settle(self, payload: bytes) -> None:
        """Publish, then wait until the agent has given its verdict (a row, or a count)."""
        before = await self.verdicts()
        await self.feed(payload)
        async with asyncio.timeout(10):
            while await self.verdicts() == before:  # noqa: ASYNC110 - the ledger is the signal
                await asyncio.sleep(0.01)


@pytest.fixture
async def fuzzed(secure_broker_factory: Any, tmp_path: Path) -> AsyncIterator[Fuzzed]:
    secure = secure_broker_factory(tree_fleet(TREE))
    fleet = secure.fleet
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, names=["coordinator"])
        peer = await open_peer(stack, secure, "specialist_a")
        yield Fuzzed(
            agents["coordinator"],
            peer,
            fleet.agent("coordinator").id,
            fleet.agent("specialist_a").id,
        )


async def still_serving(fuzzed: Fuzzed) -> None:
    # The ack of a message sent after the fuzzed one proves the inbound loop still runs.
    job = new_message(MSG_JOB_DETECTED, source=fuzzed.spec_id, target=fuzzed.coord_id, details=JOB)
    await fuzzed.feed(serialize(job))
    await wait_for(
        lambda: any(
            m.details.get("in_response_to") == str(job.message_id)
            for m in fuzzed.peer.of_type(MSG_ACKNOWLEDGED)
        )
    )


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.binary(max_size=600))
async def test_arbitrary_bytes_never_stop_the_agent(
    fuzzed: Fuzzed, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="vox_mqtt"):
        await fuzzed.feed_and_settle(payload)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(TYPES),
    details=st.dictionaries(st.text(max_size=12), json_values, max_size=5),
    reply_to=st.none() | st.uuids(),
    forge=st.booleans(),
)
async def test_valid_looking_envelopes_never_stop_the_agent(
    fuzzed: Fuzzed,
    kind: str,
    details: dict[str, Any],
    reply_to: UUID | None,
    forge: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    envelope = {
        "message_id": str(uuid4()),
        "message_source": "fuzz",
        "emitted_at": "2026-01-11T08:00:00-03:00",
        "source": str(fuzzed.coord_id if forge else fuzzed.spec_id),
        "target": str(fuzzed.coord_id),
        "type": kind,
        "details": details,
    }
    if reply_to is not None:
        envelope["reply_to"] = str(reply_to)
    with caplog.at_level(logging.ERROR, logger="vox_mqtt"):
        await fuzzed.feed_and_settle(json.dumps(envelope).encode())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_after_a_storm_of_garbage_the_agent_still_answers(fuzzed: Fuzzed) -> None:
    for index in range(200):
        await fuzzed.feed(bytes([index % 256]) * (index % 17))
    await still_serving(fuzzed)
    rows = await fuzzed.coordinator.memory.get_recent(500)
    recorded = sum(r["action"] == "rejected" for r in rows)
    # Beyond the peer's budget a refusal is counted, not recorded (agent/budget.py).
    assert recorded + fuzzed.coordinator.metrics.unrecorded.total() == 200
    assert recorded <= REFUSAL_BUDGET.burst + 10
