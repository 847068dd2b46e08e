"""Progress climbs the tree: a handler's reports and its request's states, rate-bounded.

Each served request has a window on its record (`Served.progress`): its `seq`, the time it
last sent, and the newest report waiting for the window (docs/messages.md, "A request's
life"). Nothing here is recorded or kept: a command_progress is published once, QoS 1, and
never re-sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from vox_mqtt.agent.ports import Publisher, Settings
from vox_mqtt.agent.requests import CURRENT_REQUEST, Requests, Served
from vox_mqtt.agent.standing import progress_delay
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.lifecycle import MAX_TEXT, MSG_COMMAND_PROGRESS, CommandProgress
from vox_mqtt.protocol.messages import serialize
from vox_mqtt.protocol.requeststates import RequestState
from vox_mqtt.protocol.settings import AgentConfig
from vox_mqtt.transport.publishprops import PublishProperties

__all__ = ["PROGRESS_INTERVAL", "ProgressReporter"]

log = logging.getLogger("vox_mqtt.agent")

# At most one command_progress per request per level in this many seconds, the first one
# this long after the request's first state; the newest report inside the window replaces
# the one waiting and goes when it opens.
PROGRESS_INTERVAL: Final = 0.5


class ProgressReporter:
    """Send command_progress to the master for the requests this agent serves."""

    def __init__(
        self,
        *,
        settings: Settings,
        publisher: Publisher,
        props: PublishProperties,
        metrics: AgentMetrics,
        requests: Requests,
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._props = props
        self._metrics = metrics
        self._requests = requests  # the records the windows hang on

    @property
    def config(self) -> AgentConfig:
        """Return the agent's config as it is now."""
        return self._settings()

    async def progress(self, fraction: float | None = None, text: str | None = None) -> None:
        """Tell the master how far the command this handler serves is (rate-bounded).

        At most one command_progress per request every PROGRESS_INTERVAL seconds leaves this
        agent: a newer report inside the window replaces the one waiting (docs/messages.md).
        """
        served = CURRENT_REQUEST.get()
        if served is None:
            raise VoxError("progress() reports on a command: call it from a command handler")
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must lie in 0..1, not {fraction!r}")
        if text is not None:
            text = text[:MAX_TEXT]
        self.emit(served, {"state": "working", "fraction": fraction, "text": text})

    def moved(self, served: Served, state: RequestState) -> None:
        """A served request moved: its master hears of working and delegated."""
        if state is RequestState.WORKING or state is RequestState.DELEGATED:
            self.emit(served, {"state": state})
        elif served.final:
            window = served.progress
            if window is not None and window.timer is not None:
                window.timer.cancel()  # dropped: the answer says the rest
                window.timer = None

    def emit(self, served: Served, part: Mapping[str, Any]) -> None:
        """Send a served request's progress now, or as the newest report of its window."""
        if served.final or served.answering:
            return  # the answer is on its way: progress after it would mislead
        window = self._requests.progress_window(served)
        try:
            details = CommandProgress.model_validate({**part, "seq": window.seq + 1})
        except ValueError as exc:  # a child's part nested past MAX_DEPTH: not passed on
            log.info("%s: progress not passed on: %s", self.config.name, exc)
            return
        window.seq += 1
        now = time.monotonic()
        waiting = window.timer is not None
        delay = progress_delay(now, window.last, PROGRESS_INTERVAL, waiting)
        if delay is None:
            window.last = now
            self._send_progress(served, details)
            return
        if window.pending is not None:
            self._metrics.progress_dropped += 1
        window.pending = details
        if not waiting:
            window.timer = asyncio.get_running_loop().call_later(delay, self._flush, served)

    def _flush(self, served: Served) -> None:
        window = served.progress
        assert window is not None, "a window's timer runs for the record it hangs on"
        window.timer = None
        details, window.pending = window.pending, None
        if details is None or served.final or served.answering:
            return
        window.last = time.monotonic()
        self._send_progress(served, details)

    def _send_progress(self, served: Served, details: CommandProgress) -> None:
        """Publish once, QoS 1, unrecorded and untracked: never re-sent (docs/messages.md)."""
        message = served.request.reply(
            MSG_COMMAND_PROGRESS, details, message_source=self.config.message_source
        )
        topic = topics.inbox(message.target, self.config.id)
        props = self._props.inbox(message.target, message.type)
        try:
            sent = self._publisher.publish_soon(topic, serialize(message), props=props)
        except VoxError as exc:
            log.info("%s: progress not sent: %s", self.config.name, exc)
            return
        if sent is None:
            return  # no connection up: progress is never kept for later
        self._metrics.progress_sent += 1
        self._metrics.messages_out.inc(message.type)
