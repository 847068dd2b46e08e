"""The web console's decisions and what it pushes (docs/web.md), without a broker."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import pytest

from tests.kits.webrows import ME, ROOT, ledger_row, post, sent
from vox_mqtt.console.web import Hub, _event, _page
from vox_mqtt.console.web_operator import (
    NOTE_WITHHELD,
    inbox_rows,
    note_of,
    parse_inbox,
    request_rows,
    timeline_rows,
)
from vox_mqtt.console.web_state import WebState, bind_problem, is_loopback, same_secret
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.protocol.signing import SealKey, seal
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
    state.take(post(root, child, description="<b>x</b>"))
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


def test_tls_alone_lets_a_non_loopback_bind_start() -> None:
    assert bind_problem("0.0.0.0", None, tls=True) is None
    refused = bind_problem("0.0.0.0", None, tls=False)
    assert refused is not None
    assert "--tls-cert" in refused
    assert bind_problem("0.0.0.0", "short", tls=True) is not None  # a short token still is


def test_the_page_says_whether_the_operator_pages_exist() -> None:
    assert 'name="vox-operator" content="1"' in _page("ab" * 32, False, True)
    page = _page("ab" * 32, True, False)
    assert 'name="vox-operator" content="0"' in page
    assert 'name="vox-send" content="1"' in page
    assert "{{" not in page


def test_requests_get_their_state_from_the_replies_recorded() -> None:
    answered, failed, waiting, expired, late = (
        sent(1, "a"),
        sent(2, "b"),
        sent(3, "c"),
        sent(4, "d"),
        sent(5, "e", deadline="2026-01-01T00:00:00+00:00"),
    )
    rows = [
        answered,
        failed,
        waiting,
        expired,
        late,
        ledger_row(6, "received", "message_acknowledged", reply_to=answered["message_id"]),
        ledger_row(
            7,
            "received",
            "command_result",
            reply_to=answered["message_id"],
            details={"handled_by": ROOT},
        ),
        ledger_row(
            8,
            "received",
            "command_error",
            reply_to=failed["message_id"],
            details={"code": "HANDLER_ERROR"},
        ),
        ledger_row(9, "received", "message_acknowledged", reply_to=waiting["message_id"]),
        ledger_row(
            10,
            "expired",
            "command_request",
            message_id=expired["message_id"],
            source=ME,
            reason="no answer",
        ),
        # Someone else's request and a duplicate are not the operator's requests.
        ledger_row(11, "received", "command_request"),
        ledger_row(12, "duplicate", "command_result", reply_to=waiting["message_id"]),
    ]
    shown = request_rows(list(reversed(rows)), ME, now=1e12)
    assert [r["command"] for r in shown] == ["e", "d", "c", "b", "a"]  # newest first
    by = {r["command"]: r for r in shown}
    assert by["a"]["state"] == "ANSWERED"
    assert by["a"]["handled_by"] == ROOT
    assert by["a"]["ended_at"] == "2026-01-01T00:00:07+00:00"
    assert (by["b"]["state"], by["b"]["code"]) == ("FAILED", "HANDLER_ERROR")
    assert by["c"]["state"] == "ACKNOWLEDGED"
    assert by["c"]["in_flight"]
    assert (by["d"]["state"], by["d"]["reason"]) == ("EXPIRED", "no answer")
    assert by["e"]["state"] == "SENT"
    assert by["e"]["overdue"]  # in flight past its deadline
    assert not by["c"]["overdue"]
    assert json.loads(by["a"]["params"]) == {"x": 1}


def test_the_timeline_is_one_line_per_message() -> None:
    request = {**sent(1, "a"), "actions": ["sent"]}
    details = {"handled_by": ROOT, "secret": "x"}
    result = {
        **ledger_row(2, "received", "command_result", details=details),
        "actions": ["received"],
    }
    lines = timeline_rows([request, result])
    assert [line["message_type"] for line in lines] == ["command_request", "command_result"]
    assert lines[0]["note"] == {"command": "a"}
    assert lines[1]["note"] == {"handled_by": ROOT}


def test_the_inbox_keeps_the_note_apart_and_counts_the_new_ones() -> None:
    first, second = str(uuid4()), str(uuid4())
    text = "\n".join(
        [
            json.dumps(
                {
                    "message_id": first,
                    "type": "job_detected",
                    "source": ROOT,
                    "details": {"price": 1, "note_to_human": "<b>hi</b>"},
                }
            ),
            '{"torn": ',
            json.dumps(["not", "a", "notification"]),
            json.dumps(
                {
                    "message_id": second,
                    "type": "x",
                    "source": "nobody",
                    "message_source": "<img>",
                    "details": "plain",
                }
            ),
        ]
    )
    entries = parse_inbox(text)
    assert [e["message_id"] for e in entries] == [first, second]
    rows, unread = inbox_rows(entries, first, {ROOT: "root"}, proven=True)
    assert unread == 1
    assert [r["message_id"] for r in rows] == [second, first]  # newest first
    newest, oldest = rows
    assert oldest["note"] == "<b>hi</b>"
    assert json.loads(oldest["details"]) == {"price": 1}
    assert oldest["source_name"] == "root"
    assert not oldest["new"]
    assert newest["new"]
    assert newest["note"] is None
    assert newest["message_source"] == "<img>"
    assert newest["source_name"] is None
    assert inbox_rows(entries, None, {})[1] == 2  # no mark: all of them are new
    assert inbox_rows(entries, str(uuid4()), {})[1] == 2  # a mark not found: the same


def test_a_sealed_note_opens_with_the_operators_key_or_says_it_is_sealed() -> None:
    key, other = SealKey.generate(), SealKey.generate()
    sealed = seal("Client: Netwire", key.public)
    entries = [{"message_id": str(uuid4()), "details": {"note_to_human": sealed, "price": 1}}]
    [row], _ = inbox_rows(entries, None, {}, key, proven=True)
    assert (row["note"], row["sealed"]) == ("Client: Netwire", None)
    for wrong in (None, other):
        [row], _ = inbox_rows(entries, None, {}, wrong, proven=True)
        assert row["note"] is None
        assert row["sealed"].startswith("sealed for the operator")
        assert "vox-sealed" not in json.dumps(row)  # never the ciphertext
    assert note_of("in clear", None) == ("in clear", None)
    assert note_of(None, key) == (None, None)


def test_no_note_is_served_to_a_request_that_did_not_prove_the_operator() -> None:
    """docs/security.md, F28: without the token, neither a sealed nor a clear note."""
    key = SealKey.generate()
    entries = [
        {"message_id": str(uuid4()), "details": {"note_to_human": seal("Netwire", key.public)}},
        {"message_id": str(uuid4()), "details": {"note_to_human": "Client: Netwire"}},
        {"message_id": str(uuid4()), "details": {"price": 1}},
    ]
    rows, unread = inbox_rows(entries, None, {}, key)  # proven defaults to False
    assert unread == 3
    plain, clear, sealed = rows
    for row in (clear, sealed):
        assert row["note"] is None
        assert row["sealed"] == NOTE_WITHHELD
    assert (plain["note"], plain["sealed"]) == (None, None)
    text = json.dumps(rows)
    assert "Netwire" not in text
    assert "vox-sealed" not in text
    assert "note_to_human" not in text


def test_posts_are_numbered_for_a_follower_and_the_oldest_are_counted_when_gone() -> None:
    from vox_mqtt.console.web_state import POSTS_KEPT

    root = uuid4()
    state = WebState(FleetObserver(), top=OPERATOR, top_name="operator")
    assert state.posts_since(-1) == (0, 0, [])  # where a follower starts: nothing yet
    first, second = uuid4(), uuid4()
    state.take(post(root, first))
    state.take(post(root, second))
    last, missed, posts = state.posts_since(0)
    assert (last, missed) == (2, 0)
    assert [p.topic.subject for p in posts] == [first, second]
    assert state.posts_since(1)[2][0].topic.subject == second
    assert state.posts_since(2) == (2, 0, [])
    assert state.posts_since(-1)[:2] == (2, 0)  # a new follower starts after them
    for _ in range(POSTS_KEPT + 5):
        state.take(post(uuid4(), uuid4()))  # many sources: one alone is bounded (warroomguard)
    last, missed, posts = state.posts_since(2)
    assert (last, missed, len(posts)) == (POSTS_KEPT + 7, 5, POSTS_KEPT)
