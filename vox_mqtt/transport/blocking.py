"""The session for a synchronous caller: the broker's canary and dynamic-security control.

`BlockingSession` is `Session` (transport/session.py) with blocking calls, each bounded by
its own timeout. The session lives on an event loop of its own, run by a thread of its own
that `with` starts and `close()` joins, after the session has ended (DISCONNECT within
`CLOSE_BOUND`) and the executor thread paho's blocking connect ran in is joined too: nothing
is left behind (docs/transport.md, "A synchronous caller"). A caller inside a running event
loop may use it (a command run from a test's loop): its calls block that loop, as any
synchronous call does; an async caller that must not block holds a `Session`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

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
        self._subscriptions = tuple(subscriptions)
        self._session: Session | None = None  # made on its loop, by __enter__
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"vox-mqtt {settings.client_id}", daemon=True
        )
        self._received: asyncio.Queue[Inbound] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    def __enter__(self) -> BlockingSession:
        """Connect and subscribe within the settings' connect_timeout; raise why not."""
        self._thread.start()
        try:
            self._run(self._enter())
        except BaseException:
            self.close()
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
        return self._session is not None and self._session.connected

    def close(self) -> None:
        """Disconnect (the DISCONNECT gets Client.close's bound), then end the loop and its
        thread."""
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():  # never entered
            self._loop.close()
            return
        try:
            self._run(self._exit())
        finally:
            self._run(self._wind_up())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run work on the session's loop and wait for it: each call bounds its own time."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _enter(self) -> None:
        self._session = Session(self.settings, subscriptions=self._subscriptions, retry=False)
        await self._session.__aenter__()
        self._received = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(
            self._read(self._session, self._received)
        )

    async def _exit(self) -> None:
        if self._session is not None:
            await self._session.__aexit__(None, None, None)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.wait({self._reader})

    async def _wind_up(self) -> None:
        """Cancel whatever is left on the loop, then join the executor's threads (the
        blocking connect's), as asyncio.run does when it ends."""
        here = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not here]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
        await self._loop.shutdown_asyncgens()
        await self._loop.shutdown_default_executor()

    async def _read(self, session: Session, into: asyncio.Queue[Inbound]) -> None:
        # A receive() waits on this queue, whose get() can be cancelled at its timeout
        # without ending the session's message iterator.
        async for message in session.messages():
            into.put_nowait(message)

    async def _publish(
        self, topic: str, payload: bytes, retain: bool, content_type: str | None, wait: float
    ) -> PublishOutcome:
        session = self._session
        sent = None
        if session is not None:
            sent = session.publish_soon(topic, payload, retain=retain, content_type=content_type)
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
