"""The request owner's side of a request's life: canceled, the move hook, counts by state."""

from __future__ import annotations

from uuid import UUID, uuid4

from vox_mqtt.agent.plan import Delegate, Serve
from vox_mqtt.agent.requests import CURRENT_REQUEST, Requests, Served, ServedState
from vox_mqtt.agent.tracking import RequestTracker
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage, new_message

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
    requests.move(served, ServedState.CANCELED)
    assert served.final
    assert requests.get(served.message_id) is None
    assert dict(requests.load) == {}
    assert requests.relaying(downstream.message_id) is None
    requests.move(served, ServedState.COMPLETED)  # a late end changes nothing
    assert served.state is ServedState.CANCELED


async def test_each_move_is_told_to_the_hook_and_counted_by_state() -> None:
    requests = Requests(RequestTracker())
    told: list[tuple[Served, ServedState]] = []
    requests.on_move = lambda served, state: told.append((served, state))
    first = requests.open(command(), Serve(handler=print))
    second = requests.open(command(), Serve(handler=print))
    requests.move(first, ServedState.WORKING)
    assert requests.count(ServedState.WORKING) == 1
    assert requests.count(ServedState.RECEIVED) == 1
    requests.move(first, ServedState.CANCELED)
    requests.move(first, ServedState.COMPLETED)  # final already: not told
    assert told == [(first, ServedState.WORKING), (first, ServedState.CANCELED)]
    assert requests.count(ServedState.WORKING) == 0
    assert requests.in_flight == 1
    assert requests.get(second.message_id) is second


def test_no_command_is_current_outside_a_handler() -> None:
    assert CURRENT_REQUEST.get() is None
