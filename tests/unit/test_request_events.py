"""The request events: written by the records' owners, read in order by one reader."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import uuid4

import pytest

from vox_mqtt.agent.eventreader import RequestEventReader
from vox_mqtt.agent.followevents import Followers
from vox_mqtt.agent.plan import Serve
from vox_mqtt.agent.requestevents import EventQueue
from vox_mqtt.agent.requests import RequestEvent, Requests, ServedMoved
from vox_mqtt.agent.tracking import (
    RequestTracker,
    SentMoved,
    SentProgress,
    SentState,
    TrackedRequest,
)
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage, new_message
from vox_mqtt.protocol.requeststates import RequestState

ME, CHILD = uuid4(), uuid4()


def command() -> VOXMessage:
    return new_message(MSG_COMMAND_REQUEST, source=ME, target=CHILD, details={"command": "x"})


class Reporter:
    """Stands in for the progress reporter: what the reader hands it."""

    def __init__(self) -> None:
        self.moves: list[tuple[object, RequestState]] = []

    def moved(self, served: object, state: RequestState) -> None:
        self.moves.append((served, state))


def reader(
    requests: Requests, followers: Followers, hook: Any = None
) -> tuple[RequestEventReader, Reporter, AgentMetrics]:
    reporter, metrics = Reporter(), AgentMetrics()
    built = RequestEventReader(
        requests.events,
        name="agent",
        reporter=reporter,  # type: ignore[arg-type]
        followers=followers,
        metrics=metrics,
        on_request_change=hook,
    )
    return built, reporter, metrics


async def test_an_owner_calls_nobody_its_moves_wait_on_the_queue_in_order() -> None:
    requests = Requests(RequestTracker())
    served = requests.open(command(), Serve(handler=print))
    sent = requests.sent.track(command(), expects_reply=True)
    requests.move(served, RequestState.WORKING)
    requests.sent.dispatched(sent.message_id)
    requests.move(served, RequestState.COMPLETED)
    events = requests.events.take()
    assert [type(e) for e in events] == [ServedMoved, SentMoved, ServedMoved]
    built, reporter, metrics = reader(requests, Followers(requests.sent))
    assert reporter.moves == []  # nothing read yet: the owner told nobody
    built.read(events)
    assert reporter.moves == [(served, RequestState.WORKING), (served, RequestState.COMPLETED)]
    assert dict(metrics.requests_ended.values) == {"completed": 1}


async def test_a_follower_that_came_between_a_move_and_its_event_hears_it_once() -> None:
    requests = Requests(RequestTracker())
    followers = Followers(requests.sent)
    built, _, _ = reader(requests, followers)
    sent = requests.sent.track(command(), expects_reply=True)
    requests.sent.acknowledged(sent.message_id)  # moved; its event not read yet
    stream = followers.follow(sent)
    told = [await anext(stream), await anext(stream)]  # the history: sent, acknowledged
    built.read_waiting()  # the acknowledged move's event comes now: already told
    requests.sent.completed(sent.message_id, sent.message.reply("command_result", {}))
    built.read_waiting()
    told.append(await asyncio.wait_for(anext(stream), 1.0))
    assert [e["state"] for e in told] == ["sent", "acknowledged", "completed"]
    await stream.aclose()


async def test_a_childs_progress_reaches_the_followers_after_the_moves_before_it() -> None:
    requests = Requests(RequestTracker())
    followers = Followers(requests.sent)
    built, _, _ = reader(requests, followers)
    sent = requests.sent.track(command(), expects_reply=True)
    stream = followers.follow(sent)
    assert (await anext(stream))["state"] == "sent"
    requests.sent.acknowledged(sent.message_id)
    progress = {"state": "working", "at": "2026-12-07T00:00:00.000+00:00", "details": {}}
    requests.events.put(SentProgress(sent, progress))
    built.read_waiting()
    told = [await anext(stream), await anext(stream)]
    assert [e["state"] for e in told] == ["acknowledged", "working"]
    await stream.aclose()


async def test_a_failing_hook_stops_neither_the_reader_nor_the_next_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    requests = Requests(RequestTracker())
    seen: list[SentState] = []

    def hook(tracked: TrackedRequest, old: SentState, new: SentState) -> None:
        seen.append(new)
        if new is SentState.DISPATCHED:
            raise RuntimeError("the owner's bug")

    built, _, metrics = reader(requests, Followers(requests.sent), hook)
    sent = requests.sent.track(command(), expects_reply=True)
    served = requests.open(command(), Serve(handler=print))
    running = asyncio.create_task(built.run())
    with caplog.at_level(logging.ERROR, logger="vox_mqtt.agent"):
        requests.sent.dispatched(sent.message_id)
        requests.move(served, RequestState.FAILED)
        requests.sent.acknowledged(sent.message_id)
        for _ in range(5):
            await asyncio.sleep(0)
    assert not running.done()  # the hook's failure did not end the reader
    running.cancel()
    assert seen == [SentState.DISPATCHED, SentState.ACKNOWLEDGED]
    assert dict(metrics.requests_ended.values) == {"failed": 1}
    assert "on_request_change failed" in caplog.text


async def test_the_queue_hands_out_every_event_waiting_oldest_first() -> None:
    queue: EventQueue[RequestEvent] = EventQueue()
    waiter = asyncio.create_task(queue.next_batch())
    await asyncio.sleep(0)
    assert not waiter.done()  # nothing yet: it waits
    tracked = RequestTracker().track(command(), expects_reply=True)
    first = SentProgress(tracked, {"state": "working"})
    second = SentProgress(tracked, {"state": "progress"})
    queue.put(first)
    queue.put(second)
    assert await asyncio.wait_for(waiter, 1.0) == [first, second]
    assert len(queue) == 0
    assert queue.take() == []


async def test_followers_hang_on_the_request_and_leave_it_when_they_stop() -> None:
    requests = Requests(RequestTracker())
    followers = Followers(requests.sent)
    sent = requests.sent.track(command(), expects_reply=True)
    assert sent.followers == ()
    first, second = followers.follow(sent), followers.follow(sent)
    assert (await anext(first))["state"] == (await anext(second))["state"] == "sent"
    assert len(sent.followers) == 2
    await first.aclose()
    assert len(sent.followers) == 1
    await second.aclose()
    assert sent.followers == ()
