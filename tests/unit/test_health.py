"""`vox exporter`'s /health (vox_mqtt/console/health.py): the answer, decided purely."""

from __future__ import annotations

from uuid import uuid4

from vox_mqtt.console.health import health
from vox_mqtt.observe.status import AgentLiveness


def seen(status: str) -> AgentLiveness:
    return AgentLiveness(id=uuid4(), status=status, last_heartbeat="2026-01-01T00:00:00+00:00")


def test_connected_is_200_and_counts_the_agents_seen_by_state() -> None:
    agents = [seen("ACTIVE"), seen("ACTIVE"), seen("INACTIVE"), AgentLiveness(id=uuid4())]
    code, body = health(connected=True, agents=agents)
    assert code == 200
    assert body == {
        "status": "ok",
        "broker": "connected",
        "agents": 3,
        "by_state": {"ACTIVE": 2, "INACTIVE": 1},
    }


def test_no_broker_session_is_503_and_says_why() -> None:
    code, body = health(connected=False, agents=[seen("ACTIVE")])
    assert code == 503
    assert body["status"] == "unavailable"
    assert "no broker session" in body["reason"]
