"""RequestTracker: the states a sent message moves through, each an event on its queue."""

from __future__ import annotations

import asyncio
from uuid import uuid4

from vox_mqtt.agent.deliveries import Deliveries
from vox_mqtt.agent.tracking import Delivery, RequestTracker, SentMoved, SentState
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, new_message

A, B = uuid4(), uuid4()


def request():  # type: ignore[no-untyped-def]
    return new_message(MSG_COMMAND_REQUEST, source=A, target=B, details={"command": "x"})


def test_request_moves_through_every_state_and_each_move_is_an_event() -> None:
    tracker = RequestTracker()
    message = request()
    tracked = tracker.track(message, expects_reply=True)
    tracker.dispatched(message.message_id)
    tracker.acknowledged(message.message_id)
    assert not tracked.final
    reply = message.reply("command_result", {"result": 1})
    tracker.completed(message.message_id, reply)
    assert tracked.state is SentState.COMPLETED
    assert tracked.reply == reply
    events = tracker.events.take()
    assert all(isinstance(e, SentMoved) and e.tracked is tracked for e in events)
    moves = [(e.old.value, e.new.value, e.step) for e in events if isinstance(e, SentMoved)]
    assert moves == [
        ("queued", "dispatched", 1),
        ("dispatched", "acknowledged", 2),
        ("acknowledged", "completed", 3),
    ]
    # Each event names its place in the history: a follower that replayed it skips it.
    assert [tracked.history[step][0] for _, _, step in moves] == [
        SentState.DISPATCHED,
        SentState.ACKNOWLEDGED,
        SentState.COMPLETED,
    ]
    assert tracker.events.take() == []
    assert tracker.get(message.message_id) is tracked
    assert tracked.done.is_set()


def test_message_without_reply_completes_on_ack() -> None:
    tracker = RequestTracker()
    message = request()
    tracked = tracker.track(message, expects_reply=False)
    tracker.acknowledged(message.message_id)
    assert tracked.state is SentState.COMPLETED


def test_failure_is_final_and_later_replies_do_not_revive_it() -> None:
    tracker = RequestTracker()
    message = request()
    tracked = tracker.track(message, expects_reply=True)
    tracker.failed(message.message_id, "TIMEOUT", "no answer")
    tracker.completed(message.message_id, message.reply("command_result", {}))
    assert tracked.state is SentState.FAILED
    assert tracked.error_code == "TIMEOUT"
    assert tracker.pending() == []


def test_finished_requests_are_forgotten_beyond_the_limit() -> None:
    tracker = RequestTracker(keep_finished=2)
    ids = []
    for _ in range(3):
        message = request()
        ids.append(message.message_id)
        tracker.track(message, expects_reply=False)
        tracker.acknowledged(message.message_id)
    assert tracker.get(ids[0]) is None
    assert tracker.get(ids[2]) is not None


def delivery() -> Delivery:
    return Delivery(payload=b"{}", props=None, give_up_at=0.0, resend_until=None, delay=1.0)


def test_a_delivery_hangs_on_its_record_until_taken_off() -> None:
    tracker = RequestTracker()
    first, second = (
        tracker.track(request(), expects_reply=True),
        tracker.track(request(), expects_reply=False),
    )
    assert tracker.delivering() == []
    being_sent = delivery()
    tracker.deliver(first, being_sent)
    tracker.deliver(second, delivery())
    assert first.delivery is being_sent
    assert tracker.delivering() == [first, second]
    assert tracker.undeliver(first) is being_sent
    assert tracker.undeliver(first) is None  # taken off once: a second stop finds nothing
    assert tracker.delivering() == [second]


async def test_an_end_being_recorded_holds_its_waiters_until_it_is_durable() -> None:
    tracker = RequestTracker()
    tracked = tracker.track(request(), expects_reply=True)
    await Deliveries.recorded(tracked)  # nothing being recorded: at once
    tracker.recording_end(tracked)
    waiter = asyncio.create_task(Deliveries.recorded(tracked))
    canceled = asyncio.create_task(Deliveries.recorded(tracked))
    await asyncio.sleep(0)
    canceled.cancel()  # a waiter that gives up does not spoil the end for the others
    await asyncio.sleep(0)
    assert not waiter.done()
    tracker.end_recorded(tracked)
    await asyncio.wait_for(waiter, 1.0)
    assert tracked.ending is None
