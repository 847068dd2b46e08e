"""The request owner's side of a request's life: canceled, each move an event, counts by state."""

from __future__ import annotations

from uuid import UUID, uuid4

from vox_mqtt.agent.plan import Delegate, Serve
from vox_mqtt.agent.requests import CURRENT_REQUEST, Requests, ServedMoved
from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage, new_message
from vox_mqtt.protocol.requeststates import RequestState

MASTER, ME, CHILD = uuid4(), uuid4(), uuid4()


def command(source: UUID = MASTER, target: UUID = ME) -> VOXMessage:
    return new_message(
        MSG_COMMAND_REQUEST, source=source, target=target, details={"command": "analyze"}
    )


async def test_canceled_is_final_and_frees_the_childs_load() -> None:
    requests = Requests(RequestTracker())
    served = requests.open(command(), Delegate(child=CHILD))
    downstream = requests.sent.track(command(ME, CHILD), expects_reply=True)
    requests.delegate(served, CHILD, downstream)
    assert requests.claim_answer(served)  # the cancel takes the right to answer
    requests.move(served, RequestState.CANCELED)
    assert served.final
    assert requests.get(served.message_id) is None
    assert dict(requests.load) == {}
    assert requests.relaying(downstream.message_id) is None
    requests.move(served, RequestState.COMPLETED)  # a late end changes nothing
    assert served.state is RequestState.CANCELED


async def test_each_move_is_an_event_on_the_queue_and_counted_by_state() -> None:
    requests = Requests(RequestTracker())
    first = requests.open(command(), Serve(handler=print))
    second = requests.open(command(), Serve(handler=print))
    requests.move(first, RequestState.WORKING)
    assert requests.count(RequestState.WORKING) == 1
    assert requests.count(RequestState.RECEIVED) == 1
    requests.move(first, RequestState.CANCELED)
    requests.move(first, RequestState.COMPLETED)  # final already: not told
    told = requests.events.take()  # one queue with the tracker's (agent/requestevents.py)
    assert requests.sent.events is requests.events
    assert told == [
        ServedMoved(first, RequestState.WORKING),
        ServedMoved(first, RequestState.CANCELED),
    ]
    assert requests.count(RequestState.WORKING) == 0
    assert requests.in_flight == 1
    assert requests.get(second.message_id) is second


def test_no_command_is_current_outside_a_handler() -> None:
    assert CURRENT_REQUEST.get() is None
