"""What an agent says of itself: its birth, heartbeats, will and SHUTDOWN (docs/liveness.md).

Two retained topics carry it: the full status (a report: commands, figures, the ledger's
head; read by its master and the operator's tools) and the presence (its state and epoch
only, readable by its children; the will goes there). `OwnStatus` builds and publishes
both; when they go out is the liveness loop's to say (liveness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from vox_mqtt._version import __version__
from vox_mqtt.agent.context import AgentContext
from vox_mqtt.agent.reconcile import CATCH_UP
from vox_mqtt.agent.sendrules import check_size
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.observe.status import (
    ACTIVE,
    DEGRADED,
    INACTIVE,
    LEDGER_UNAVAILABLE,
    SHUTDOWN,
    VM_CONNECTION_LOST,
    WILL_EXPIRY,
    EpochCounter,
    host_metrics,
)
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import LedgerError
from vox_mqtt.protocol.messages import (
    MSG_AGENT_STATUS,
    AgentStatus,
    LedgerHead,
    VOXMessage,
    new_message,
    now_iso,
    serialize,
)
from vox_mqtt.protocol.settings import AgentConfig, Will

__all__ = ["WILL_DETAIL", "OwnStatus", "own_status_answer"]

log = logging.getLogger("vox_mqtt.liveness")

# What the will says of itself: it is built at connect and published by the broker later,
# so its emitted_at is not the loss's time (docs/liveness.md, "The will's time").
WILL_DETAIL: Final = (
    "will: set at connect (emitted_at); the broker publishes it at death"
    " (its time: the message expiry left, docs/liveness.md)"
)

_STATUS_WORDS: Final[dict[str, Literal["ACTIVE", "DEGRADED"]]] = {
    ACTIVE: "ACTIVE",
    DEGRADED: "DEGRADED",
}

Answer = Literal["backlog", "replay"]


def own_status_answer(
    *,
    their_epoch: object,
    our_epoch: int,
    retained: bool,
    online: bool,
    now: float,
    born_at: float | None,
    backlog_answered: float | None,
    replay_answered_at: float,
    interval: float,
) -> Answer | None:
    """Return why a status of our own that just arrived gets ours published again, or None.

    A retained copy at subscribe time is the previous session's last word, before our
    birth; only a live one older than this session is an intruder. `backlog`: the first
    within CATCH_UP of this birth (born_at) is our persistent session's queue, which may
    hold our previous session's will: answered once per connection, outside the replay
    allowance, so a late will right after it is still answered. `replay`: a replay of old
    statuses (F23, docs/security.md) is answered once per heartbeat interval, not each one:
    the next beat puts ours back anyway.
    """
    if retained or not isinstance(their_epoch, int) or their_epoch >= our_epoch or not online:
        return None
    if born_at is not None and now < born_at + CATCH_UP and backlog_answered != born_at:
        return "backlog"
    if now - replay_answered_at < interval:
        return None
    return "replay"


class OwnStatus:
    """Build and publish this agent's status and presence: birth, heartbeat, will, SHUTDOWN.

    advertise: the commands this agent offers while ACTIVE; params: what each takes
    (docs/liveness.md, "Parameter schemas"); safely: runs a publish whose refusal or
    failure is logged, never raised (the loop goes on).
    """

    def __init__(
        self,
        ctx: AgentContext,
        *,
        advertise: Callable[[], list[str]],
        params: Callable[[list[str]], dict[str, dict[str, Any]]] | None = None,
        safely: Callable[[Awaitable[None]], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.advertise = advertise
        self.params = params
        self._safely = safely
        self.epoch_counter = EpochCounter(ctx.config.state_dir)
        self.epoch = self.epoch_counter.value
        self.started_at = now_iso()
        # Counts up with every status and presence of this epoch: a watcher ignores one not
        # newer than the last it took (a replay, docs/security.md); the will carries none.
        self.sequence = 0
        self.born_at: float | None = None  # monotonic time of this connection's birth
        self._advertised: list[str] | None = None
        self._published_failure: str | None = None  # the ledger failure our status names
        self._head_read: tuple[int, tuple[int, str]] | None = None  # (commits then, head)
        self._replay_answered_at = -float("inf")  # when our status last went out again (F23)
        self._backlog_answered: float | None = None  # the birth whose backlog got its answer

    @property
    def config(self) -> AgentConfig:
        """The agent's config as it stands: the context's cell, which a reload replaces."""
        return self.ctx.config

    def online(self) -> bool:
        """Tell whether a status may go out now: connected, and publishing statuses.

        While the session is down a publish would wait for it: the birth covers the gap.
        """
        return self.ctx.session.connected and self.config.publish_status

    # --- the messages ---------------------------------------------------------------------

    def _status_message(
        self,
        status: str,
        error_code: str | None,
        metrics: dict[str, Any] | None = None,
        *,
        head: tuple[int, str] | None = None,
        detail: str | None = None,
        presence: bool = False,
        counted: bool = True,
    ) -> VOXMessage:
        """Return the full status, or (presence) what its children may read of it.

        The presence names no master and no command, and is addressed to the agent itself:
        its children learn only that it is alive, its state and epoch (docs/liveness.md).
        """
        word: Literal["ACTIVE", "INACTIVE", "DEGRADED"] | None
        if presence:
            target = self.config.id
            metrics, head = None, None
            detail = WILL_DETAIL if not counted else None
            word = _STATUS_WORDS.get(status, "INACTIVE")
        else:
            target = self.config.master_id or topics.WARROOM_ID
            # The full status says no state while the agent runs: the presence, which gets
            # the will, is the one topic that tells (docs/liveness.md, "Which topic tells").
            # A stop is its own last word, true for good: it says so.
            word = None if status in _STATUS_WORDS else "INACTIVE"
        serving = status == ACTIVE and not presence
        commands = self.advertise() if serving else []
        report = AgentStatus(
            name=self.config.name,
            status=word,
            error_code=error_code,
            epoch=self.epoch,
            started_at=self.started_at,
            heartbeat_interval=self.config.heartbeat_interval,
            commands=commands,
            commands_down=self.ctx.commands_down() if serving else [],
            version=__version__,
            metrics=metrics or {},
            ledger_head=None if head is None else LedgerHead(row=head[0], hash=head[1]),
            detail=None if detail is None else detail[:300],
            sequence=self._next_sequence() if counted else None,
            params=(self.params(commands) or None) if serving and self.params else None,
        )
        return new_message(
            MSG_AGENT_STATUS,
            source=self.config.id,
            target=target,
            details=report,
            message_source=self.config.message_source,
        )

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def will(self) -> Will | None:
        """Return the will for the next connection, which starts a new epoch."""
        if not self.config.publish_status:
            return None
        self.epoch = self.epoch_counter.next()
        self.sequence = 0
        # One will per connection, on the presence: its children and its master (who reads
        # both topics) learn of the loss alike; the full status keeps its last report.
        # Without a sequence: the broker publishes it after every status of its epoch.
        message = self._status_message(INACTIVE, VM_CONNECTION_LOST, presence=True, counted=False)
        return Will(
            topic=topics.presence(self.config.id),
            payload=serialize(message),
            retain=True,
            user_properties=self.ctx.publish_props.will(MSG_AGENT_STATUS),
            message_expiry=WILL_EXPIRY,  # counted down by the broker from the loss
        )

    # --- publishing -----------------------------------------------------------------------

    async def birth(self) -> None:
        """Publish the birth certificate of this connection."""
        self.born_at = time.monotonic()
        if self.config.publish_status:
            await self.publish_status(presence=True)

    async def publish_status(
        self, metrics: dict[str, Any] | None = None, *, presence: bool = False
    ) -> None:
        """Publish the retained ACTIVE status (birth, heartbeat, new advertisement).

        presence: the presence too (birth, heartbeat, a change of state); a new
        advertisement alone changes nothing there.
        """
        if not self.config.publish_status:
            return
        if metrics is None:
            metrics = self.figures()
        failure = self.ctx.ledger.write_failure
        self._published_failure = failure
        head = await self._ledger_head()
        if failure is None:
            state, code, detail = ACTIVE, None, None
        else:
            # It cannot record, so it accepts nothing: its master routes elsewhere.
            state, code, detail = DEGRADED, LEDGER_UNAVAILABLE, f"cannot record: {failure}"
        message = self._status_message(state, code, metrics, head=head, detail=detail)
        self._advertised = list(message.details.get("commands", []))
        await self._publish(message)
        if presence:
            await self._publish(self._status_message(state, code, presence=True), presence=True)

    async def heartbeat(self) -> dict[str, Any]:
        """Publish a beat (status and presence); return the figures it carried.

        A ledger that failed gets a write each beat, to learn when it can record again.
        """
        if self.ctx.ledger.write_failure is not None:
            with contextlib.suppress(LedgerError):
                await self.ctx.ledger.record(
                    "health", LedgerAction.LEDGER_PROBE, self.config.id, None, {}
                )
        metrics = self.figures()
        await self._safely(self.publish_status(metrics, presence=True))
        return metrics

    async def _publish(self, message: VOXMessage, *, presence: bool = False) -> None:
        session = self.ctx.session
        topic = topics.presence(self.config.id) if presence else topics.status(self.config.id)
        await session.publish(
            topic,
            self._checked(message),
            retain=True,
            props=self.ctx.publish_props.own(MSG_AGENT_STATUS),
        )

    async def publish_shutdown(self, bound: float | None = None) -> None:
        """Publish the retained INACTIVE SHUTDOWN status before a graceful disconnect.

        Waits at most `bound` seconds for the broker's acknowledgements: both messages are
        written before that wait starts, so the DISCONNECT that follows goes out behind them
        and a broker that is only slow still stores them first; a frozen one does not hold
        the stop (docs/transport.md, "Closing is bounded").
        """
        if self.config.publish_status:
            # The last counts of this process stay readable after it stops, and its ledger's
            # last head lets its master mark it final (nothing may follow it).
            head = await self._ledger_head()
            sends = [
                asyncio.ensure_future(self._publish(message, presence=presence))
                for message, presence in (
                    (self._status_message(INACTIVE, SHUTDOWN, self.figures(), head=head), False),
                    (self._status_message(INACTIVE, SHUTDOWN, presence=True), True),
                )
            ]
            try:
                done, pending = await asyncio.wait(sends, timeout=bound)
            finally:
                for send in sends:
                    send.cancel()
            for send in done:
                send.result()  # a refusal or a failed delivery is the caller's to hear
            if pending:
                raise TimeoutError(f"no PUBACK for the SHUTDOWN status within {bound:g}s")

    def _checked(self, message: VOXMessage) -> bytes:
        """Serialize, refusing (MessageTooLarge) what the broker would drop us for."""
        check_size(message, payload := serialize(message), self.config.max_message_bytes)
        return payload

    # --- what the next status would say ----------------------------------------------------

    async def _ledger_head(self) -> tuple[int, str] | None:
        # At every heartbeat: from memory when this process committed, or the last read while
        # nothing was committed since (an idle agent writes nothing: docs/ledger.md).
        ledger = self.ctx.ledger
        head = ledger.written_head
        if head is not None:
            return head
        commits = ledger.commit_count
        if self._head_read is not None and self._head_read[0] == commits:
            return self._head_read[1]
        try:
            head = await ledger.head()
        except LedgerError as exc:
            log.warning("%s: ledger head unknown: %s", self.config.name, exc)
            return None
        if ledger.commit_count == commits:
            self._head_read = (commits, head)
        return head

    def figures(self) -> dict[str, Any]:
        """Return the host figures and this agent's metrics for details.metrics."""
        figures = host_metrics(self.config.state_dir)
        snapshot = self.ctx.metrics.snapshot()
        if snapshot is not None:
            figures["agent"] = snapshot
        return figures

    def advertisement_stale(self) -> bool:
        """Tell whether our published commands differ from what we would publish now."""
        wanted = [] if self.ctx.ledger.write_failure is not None else self.advertise()
        return wanted != self._advertised

    def state_stale(self) -> bool:
        """Tell whether the ledger failed or recovered since our status last said (DEGRADED
        now, or ACTIVE again)."""
        return self.ctx.ledger.write_failure != self._published_failure

    # --- a status of ours from an older session ----------------------------------------------

    async def on_own_status(self, message: VOXMessage, *, retained: bool) -> None:
        """Put our birth back when a late status of an older session replaced it."""
        now = time.monotonic()
        answer = own_status_answer(
            their_epoch=message.details.get("epoch"),
            our_epoch=self.epoch,
            retained=retained,
            online=self.online(),
            now=now,
            born_at=self.born_at,
            backlog_answered=self._backlog_answered,
            replay_answered_at=self._replay_answered_at,
            interval=self.config.heartbeat_interval,
        )
        if answer is None:
            return
        if answer == "backlog":
            self._backlog_answered = self.born_at
        else:
            self._replay_answered_at = now
        log.warning(
            "%s: a status of epoch %d replaced ours (epoch %d): publishing ours again",
            self.config.name,
            message.details.get("epoch"),
            self.epoch,
        )
        await self._safely(self.publish_status(presence=True))
