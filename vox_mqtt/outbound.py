"""Sending: record, publish and re-send until acknowledged; the API roles and consoles use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from . import topics
from .errors import CommandFailed, DeliveryFailed, VoxError
from .messages import (
    MSG_COMMAND_ERROR,
    MSG_COMMAND_REQUEST,
    CommandError,
    CommandRequest,
    ErrorCode,
    VOXMessage,
    expiry_seconds,
    new_message,
    serialize,
)
from .tracking import RequestState, TrackedRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .agent import AgentConfig
    from .memory import VOXAgentMemory
    from .tracking import RequestTracker
    from .transport import Session

__all__ = ["OutboundMixin"]

log = logging.getLogger("vox_mqtt.agent")


class OutboundMixin:
    """The sending side of VOXAgent: every message but an ack is tracked and re-sent."""

    if TYPE_CHECKING:
        config: AgentConfig
        id: UUID
        name: str
        memory: VOXAgentMemory
        tracker: RequestTracker
        session: Session | None

        def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...

    async def send_message(self, message: VOXMessage, *, expects_reply: bool) -> TrackedRequest:
        """Record, publish and keep re-sending a message until it is acknowledged."""
        if message.target not in self.config.peers:
            raise VoxError(
                f"{self.name} may only talk to its master and children, not {message.target}"
            )
        tracked = self.tracker.track(message, expects_reply=expects_reply)
        topic = topics.inbox(message.target, self.id)
        # Whole in the outbox until acknowledged: a crash before then re-sends it on restart.
        await self.memory.record_message(message, "sent", outbox=(topic, serialize(message)))
        self._spawn(self._deliver(tracked), "deliver")
        return tracked

    async def _deliver(self, tracked: TrackedRequest) -> None:
        try:
            await self._deliver_until_acknowledged(tracked)
        finally:
            with contextlib.suppress(VoxError):
                await self.memory.outbox_done(tracked.message_id)

    async def _deliver_until_acknowledged(self, tracked: TrackedRequest) -> None:
        assert self.session is not None
        message = tracked.message
        topic = topics.inbox(message.target, self.id)
        payload = serialize(message)
        deadline = time.monotonic() + self.config.request_timeout
        delay = self.config.resend_initial
        while not tracked.final and not tracked.acknowledged.is_set():
            try:
                await self.session.publish(topic, payload, expiry=self._expiry(message))
                self.tracker.dispatched(message.message_id)
            except DeliveryFailed as exc:
                if exc.reason_code is not None and exc.reason_code >= 0x80:
                    # The broker refused it (ACL): re-sending cannot help.
                    self.tracker.failed(message.message_id, ErrorCode.DELIVERY_FAILED, str(exc))
                    return
                log.info("%s: will re-send %s: %s", self.name, message.message_id, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await tracked.acknowledged.wait()
            if time.monotonic() >= deadline and not tracked.acknowledged.is_set():
                self.tracker.failed(
                    message.message_id,
                    ErrorCode.TIMEOUT,
                    f"no acknowledgement within {self.config.request_timeout:.0f}s",
                )
                return
            delay = min(delay * 2, self.config.resend_max) * random.uniform(0.8, 1.2)

    def _expiry(self, message: VOXMessage) -> int | None:
        deadline = message.details.get("deadline")
        if message.type != MSG_COMMAND_REQUEST or not isinstance(deadline, str):
            return None
        return expiry_seconds(deadline)

    async def _publish_ack(self, message: VOXMessage) -> None:
        assert self.session is not None
        ack = message.acknowledgement(message_source=self.config.message_source)
        await self.memory.record_message(ack, "sent")
        try:
            await self.session.publish(topics.inbox(message.source, self.id), serialize(ack))
        except DeliveryFailed as exc:
            # The sender re-sends until acknowledged; its duplicate gets a new ack.
            log.warning("%s: ack for %s not delivered: %s", self.name, message.message_id, exc)

    async def _send_error_to(self, peer: UUID, reply_to: UUID, code: str, reason: str) -> None:
        message = new_message(
            MSG_COMMAND_ERROR,
            source=self.id,
            target=peer,
            reply_to=reply_to,
            details=CommandError(code=code, error=reason[:1000]),
            message_source=self.config.message_source,
        )
        with contextlib.suppress(VoxError):
            await self.send_message(message, expects_reply=False)

    async def _await_reply(self, message: VOXMessage, timeout: float | None) -> VOXMessage:
        tracked = await self.send_message(message, expects_reply=True)
        limit = self.config.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await tracked.done.wait()
        except TimeoutError:
            self.tracker.failed(
                message.message_id, ErrorCode.TIMEOUT, f"no answer within {limit:.1f}s"
            )
        if tracked.state is RequestState.COMPLETED and tracked.reply is not None:
            return tracked.reply
        raise CommandFailed(tracked.error_code or ErrorCode.TIMEOUT, tracked.error or "failed")

    # --- the API roles and consoles use ---------------------------------------------------

    async def request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage:
        """Send a command_request to a child and return its command_result (CommandFailed)."""
        message = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=to,
            details=CommandRequest(command=command, params=params or {}),
            message_source=self.config.message_source,
        )
        return await self._await_reply(message, timeout)

    async def ask(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        timeout: float | None = None,
    ) -> VOXMessage:
        """Send a message that expects an answer linked by reply_to, and return the answer."""
        message = new_message(
            type,
            source=self.id,
            target=to,
            details=details,
            message_source=self.config.message_source,
        )
        return await self._await_reply(message, timeout)

    async def send(
        self,
        type: str,
        details: dict[str, Any] | BaseModel,
        *,
        to: UUID,
        reply_to: UUID | None = None,
        message_source: str | None = None,
    ) -> TrackedRequest:
        """Send an event or answer to the master or a child; it is re-sent until acknowledged."""
        message = new_message(
            type,
            source=self.id,
            target=to,
            details=details,
            reply_to=reply_to,
            message_source=message_source or self.config.message_source,
        )
        return await self.send_message(message, expects_reply=False)

    async def notify_master(
        self, type: str, details: dict[str, Any] | BaseModel, *, message_source: str | None = None
    ) -> TrackedRequest:
        """Send an event up to this agent's master."""
        if self.config.master_id is None:
            raise VoxError(f"{self.name} has no master")
        return await self.send(
            type, details, to=self.config.master_id, message_source=message_source
        )

    async def reply(
        self, message: VOXMessage, type: str, details: dict[str, Any] | BaseModel
    ) -> TrackedRequest:
        """Answer a message: to its source, with reply_to set."""
        return await self.send_message(
            message.reply(type, details, message_source=self.config.message_source),
            expects_reply=False,
        )
