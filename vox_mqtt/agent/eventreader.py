"""The one reader of the request events (agent/requestevents.py): each, in order, to its readers.

A served command's move goes to the progress reporter (its master hears of `working` and
`delegated`) and, at its end, to the `requests_ended` counter; a sent message's move and
its child's progress go to its followers (`follow()`, `vox send --follow`), and a sent
message's move to the owner's `on_request_change`. The agent runs `run` as its
`request-events` task and reads what is left once its other tasks have stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from vox_mqtt.agent.followevents import Followers
from vox_mqtt.agent.progress import ProgressReporter
from vox_mqtt.agent.requestevents import EventQueue
from vox_mqtt.agent.requests import RequestEvent, ServedMoved
from vox_mqtt.agent.tracking import SentMoved, SentState, TrackedRequest
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol.requeststates import FINAL_STATES

__all__ = ["RequestEventReader", "SentHook"]

log = logging.getLogger("vox_mqtt.agent")

SentHook = Callable[[TrackedRequest, SentState, SentState], None]


class RequestEventReader:
    """Read the request events in the order they happened; nothing it calls may stop it."""

    def __init__(
        self,
        events: EventQueue[RequestEvent],
        *,
        name: str,
        reporter: ProgressReporter,
        followers: Followers,
        metrics: AgentMetrics,
        on_request_change: SentHook | None = None,
    ) -> None:
        self._events = events
        self._name = name
        self._reporter = reporter
        self._followers = followers
        self._metrics = metrics
        self._on_request_change = on_request_change

    async def run(self) -> None:
        """Read events as they come, until cancelled (between two batches, never in one)."""
        while True:
            self.read(await self._events.next_batch())

    def read_waiting(self) -> None:
        """Read the events waiting now (once the agent's tasks have stopped)."""
        self.read(self._events.take())

    def read(self, batch: list[RequestEvent]) -> None:
        """Hand each event to its readers, oldest first."""
        for event in batch:
            # One reader's failure keeps neither the others nor the next event from theirs.
            try:
                self._take(event)
            except Exception:
                log.exception("%s: failed to take a request event", self._name)
            if isinstance(event, SentMoved) and self._on_request_change is not None:
                try:
                    self._on_request_change(event.tracked, event.old, event.new)
                except Exception:  # the owner's code
                    log.exception("%s: on_request_change failed", self._name)

    def _take(self, event: RequestEvent) -> None:
        if isinstance(event, ServedMoved):
            self._reporter.moved(event.served, event.state)
            if event.state in FINAL_STATES:
                self._metrics.requests_ended.inc(str(event.state))
        elif isinstance(event, SentMoved):
            self._followers.moved(event.tracked, event.new, event.at, event.step)
        else:
            self._followers.tell(event.tracked, event.event)
