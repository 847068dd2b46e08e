"""The session for a synchronous caller: the broker's canary and dynamic-security control.

`BlockingSession` is `Session` (transport/session.py) with blocking calls, each bounded by
its own timeout. It owns a private event loop (`asyncio.Runner`) and runs it in the
caller's thread, during each call only: no thread of its own, so none can be left behind,
and `close()` ends the session (DISCONNECT within `CLOSE_BOUND`) and the loop with the
thread that made the blocking TCP connect (docs/transport.md, "A synchronous caller").
An async caller uses `Session` itself: these calls refuse to run inside a running loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import TypeVar

from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.inbound import Inbound
from vox_mqtt.transport.outcome import PublishOutcome
from vox_mqtt.transport.session import Session

__all__ = ["BlockingSession"]

T = TypeVar("T")


class BlockingSession:
    """One short MQTT v5 session with blocking calls: connect, publish, receive, close.

    One attempt, no reconnect (`Session(retry=False)`): a failed connection raises at once
    (`Refused` for a refusal, `BrokerUnavailable` otherwise, in words a person can act on),
    and a connection that drops ends the session. Each call returns within its timeout.
    """

    def __init__(self, settings: BrokerSettings, *, subscriptions: Sequence[str] = ()) -> None:
        self.settings = settings
        self._runner = asyncio.Runner()
        self._session = Session(settings, subscriptions=subscriptions, retry=False)
        self._received: asyncio.Queue[Inbound] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    def __enter__(self) -> BlockingSession:
        """Connect and subscribe within the settings' connect_timeout; raise why not."""
        try:
            self._run(self._enter())
        except BaseException:
            self._closed = True
            self._runner.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close: see close()."""
        self.close()

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> PublishOutcome:
        """Publish at QoS 1 and return what became of it within timeout (publish_timeout).

        Never raises for the broker's answer: accepted, refused (with the PUBACK code), or
        lost (no connection, the connection dropped, or no PUBACK within the timeout).
        """
        wait = self.settings.publish_timeout if timeout is None else timeout
        return self._run(self._publish(topic, payload, retain, content_type, wait))

    def receive(self, timeout: float) -> Inbound | None:
        """Return the next message on the subscriptions; None if none came within timeout,
        or at once when the session has ended (the connection dropped)."""
        return self._run(self._receive(timeout))

    @property
    def connected(self) -> bool:
        """Return whether the connection is still up."""
        return self._session.connected

    def close(self) -> None:
        """Disconnect (the DISCONNECT gets Client.close's bound) and end the private loop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._exit())
        finally:
            # Cancels what is left and joins the executor's thread (the blocking connect).
            self._runner.close()

    def _run(self, work: Awaitable[T]) -> T:
        async def call() -> T:
            return await work

        return self._runner.run(call())

    async def _enter(self) -> None:
        await self._session.__aenter__()
        self._received = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read(self._received))

    async def _exit(self) -> None:
        await self._session.__aexit__(None, None, None)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.wait({self._reader})

    async def _read(self, into: asyncio.Queue[Inbound]) -> None:
        # Runs whenever a call runs the loop: a receive() waits on this queue, which can be
        # cancelled at its timeout without ending the session's message iterator.
        async for message in self._session.messages():
            into.put_nowait(message)

    async def _publish(
        self, topic: str, payload: bytes, retain: bool, content_type: str | None, wait: float
    ) -> PublishOutcome:
        sent = self._session.publish_soon(topic, payload, retain=retain, content_type=content_type)
        if sent is None:
            return PublishOutcome(None, f"not connected to {self.settings.address}")
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(sent)
        except TimeoutError:
            return PublishOutcome(
                None, f"the broker at {self.settings.address} did not answer within {wait:g}s"
            )

    async def _receive(self, timeout: float) -> Inbound | None:
        if self._received is None or self._reader is None:
            return None
        if not self._received.empty():
            return self._received.get_nowait()
        if self._reader.done():
            return None  # the session ended: nothing more will come
        getting = asyncio.ensure_future(self._received.get())
        await asyncio.wait(
            {getting, self._reader}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if getting.done():
            return getting.result()
        getting.cancel()
        return None
