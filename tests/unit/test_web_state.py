"""The web console's decisions and what it pushes (docs/web.md), without a broker."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import pytest

from vox_mqtt.console.web import Hub, _event
from vox_mqtt.console.web_state import WebState, bind_problem, is_loopback, same_secret
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    MSG_SYSTEM_FAILURE,
    AgentStatus,
    SystemFailure,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.transport.session import Inbound

OPERATOR = uuid4()


def status(agent: UUID, name: str, state: str = "ACTIVE", epoch: int = 1) -> Inbound:
    report = AgentStatus(
        name=name,
        status=state,  # type: ignore[arg-type]
        epoch=epoch,
        started_at=now_iso(),
        heartbeat_interval=1.0,
        metrics={"cpu_percent": 12.5, "process_rss_bytes": 2**20},
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=OPERATOR, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=False)


def post(source: UUID, subject: UUID, *, resolved: bool = False) -> Inbound:
    failure = SystemFailure(
        error_code="VM_CONNECTION_LOST",
        severity="CRITICAL",
        description="<b>x</b>",
        resolved=resolved,
    )
    message = new_message(
        MSG_SYSTEM_FAILURE, source=source, target=topics.WARROOM_ID, details=failure
    )
    return Inbound(topic=topics.warroom(source, subject), payload=serialize(message), retain=True)


@pytest.mark.parametrize(
    ("host", "token", "refused"),
    [
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("192.0.2.7", None, True),
        ("example.org", None, True),
        ("0.0.0.0", "x" * 16, False),
        ("127.0.0.1", "short", True),
    ],
)
def test_bind_needs_a_token_beyond_loopback(host: str, token: str | None, refused: bool) -> None:
    problem = bind_problem(host, token)
    assert (problem is not None) == refused
    if problem is not None:
        assert "\n" not in problem


def test_loopback_and_secret_comparison() -> None:
    assert is_loopback("127.0.0.1")
    assert not is_loopback("10.0.0.1")
    assert same_secret("abc", "abc")
    assert not same_secret("abd", "abc")
    assert not same_secret(None, "abc")


def test_flush_sends_only_what_changed_and_then_nothing() -> None:
    a, b = uuid4(), uuid4()
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator")
    state.take(status(a, "alpha"))
    state.take(status(b, "beta"))
    first = state.flush()
    assert first is not None
    assert sorted(r["name"] for r in first["agents"]) == ["alpha", "beta"]
    assert "warroom" not in first
    assert state.flush() is None
    state.take(status(a, "alpha", epoch=2))
    second = state.flush()
    assert second is not None
    assert [r["name"] for r in second["agents"]] == ["alpha"]
    row = second["agents"][0]
    assert row["status"] == "ACTIVE"
    assert row["cpu"] == 12.5
    assert row["rss"] == 2**20


def test_an_inactive_agent_shows_no_figures() -> None:
    a = uuid4()
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator")
    state.take(status(a, "alpha", "INACTIVE"))
    row = state.snapshot()["agents"][0]
    assert row["status"] == "INACTIVE"
    assert row["cpu"] is None
    assert row["rss"] is None


def test_warroom_lists_open_then_resolved() -> None:
    root, child = uuid4(), uuid4()
    clock = [1000.0]
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator", wall=lambda: clock[0])
    state.take(post(root, child))
    batch = state.flush()
    assert batch is not None
    assert [i["subject"] for i in batch["warroom"]["open"]] == [str(child)]
    assert batch["warroom"]["open"][0]["description"] == "<b>x</b>"  # data, escaped by the page
    clock[0] += 5
    state.take(post(root, child, resolved=True))
    batch = state.flush()
    assert batch is not None
    assert batch["warroom"]["open"] == []
    resolved = batch["warroom"]["resolved"]
    assert [r["subject"] for r in resolved] == [str(child)]
    assert resolved[0]["opened"] == 1000.0
    clock[0] += 3601  # older than an hour: no longer listed
    assert state.warroom()["resolved"] == []


def test_hub_pushes_one_batch_to_every_stream() -> None:
    a = uuid4()
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator")
    hub = Hub(state)
    first, queue = hub.subscribe()
    assert first.startswith("event: snapshot\n")
    state.take(status(a, "alpha"))
    hub.push()
    text = queue.get_nowait()
    assert text is not None
    assert text.startswith("event: batch\n")
    data = json.loads(text.split("data: ", 1)[1])
    assert data["agents"][0]["name"] == "alpha"
    hub.push()
    assert queue.empty()  # nothing changed: nothing sent
    hub.close()
    assert queue.get_nowait() is None


def test_event_is_one_sse_frame() -> None:
    text = _event("batch", {"a": "x\ny"})
    assert text.count("\n\n") == 1
    assert text.endswith("\n\n")


def test_a_dropped_link_forgets_the_open_incidents() -> None:
    # A resolution clears its retained post: one missed while the link was down would
    # leave the incident open for good. The reconnect brings back those still open.
    root, child = uuid4(), uuid4()
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator")
    state.link(True)
    state.take(post(root, child))
    assert len(state.warroom()["open"]) == 1
    state.link(False)
    batch = state.flush()
    assert batch is not None
    assert batch["warroom"]["open"] == []
    assert batch["connected"] is False
