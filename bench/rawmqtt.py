"""The baseline: the same routing with bare aiomqtt clients, no VOX envelope, ledger or acks.

Each node logs in with a fleet identity (so the broker's ACL checks the same topics) under a
client id of its own, with TCP_NODELAY as the transport sets it, and publishes at QoS 1,
awaiting each PUBACK as `Session.publish` does. A request goes down the tree, a response
comes back up; relays decode the JSON body to tell the two apart, as an application would.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any
from uuid import UUID, uuid4

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from bench.common import BenchBroker
from vox_mqtt import topics

# The same socket option vox_mqtt.transport passes for every connection.
NODELAY = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def raw_client(bench: BenchBroker, name: str, **options: Any) -> aiomqtt.Client:
    """Return a bare MQTT v5 client (not yet connected) logged in as the named identity."""
    creds = bench.creds(name)
    return aiomqtt.Client(
        "127.0.0.1",
        bench.port,
        username=creds.username,
        password=creds.password,
        identifier=f"{creds.username}-raw",
        protocol=aiomqtt.ProtocolVersion.V5,
        socket_options=[NODELAY],
        **options,
    )


class RawNode:
    """One bare MQTT client on the inbox topics of a fleet identity."""

    def __init__(
        self,
        bench: BenchBroker,
        name: str,
        *,
        master: str | None = None,
        children: tuple[str, ...] = (),
    ) -> None:
        self.id = bench.id(name)
        self.master = None if master is None else bench.id(master)
        self.children = [bench.id(child) for child in children]
        self._next_child = itertools.cycle(self.children) if self.children else None
        self.client = raw_client(bench, name, keepalive=30)
        # A relay under load has many publishes in flight by design; aiomqtt warns past 10.
        self.client.pending_calls_threshold = 10_000
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        self.handled = 0

    async def __aenter__(self) -> RawNode:
        await self.client.__aenter__()
        await self.client.subscribe(topics.inbox_filter(self.id), options=SubscribeOptions(qos=1))
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._tasks:  # a relay may still await the PUBACK of an answer it passed on
            await asyncio.wait(set(self._tasks), timeout=2)
        if self._reader is not None:
            self._reader.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *filter(None, [self._reader]), return_exceptions=True)
        await self.client.__aexit__(None, None, None)

    async def request(self, to: UUID, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request down to a child and return the response that comes back."""
        request_id = str(uuid4())
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = waiter
        body = {"kind": "request", "id": request_id, "command": "echo", "params": params}
        try:
            await self._send(to, body)
            answer: dict[str, Any] = await waiter
            return answer
        finally:
            self._waiting.pop(request_id, None)

    async def _send(self, to: UUID, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        await self.client.publish(topics.inbox(to, self.id), payload, qos=1)

    async def _read(self) -> None:
        async for message in self.client.messages:
            task = asyncio.create_task(self._handle(message.payload))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, payload: Any) -> None:
        body = json.loads(payload)
        self.handled += 1
        if body["kind"] == "response":
            waiter = self._waiting.get(body["id"])
            if waiter is not None and not waiter.done():
                waiter.set_result(body)
                return
            if self.master is not None:
                await self._send(self.master, body)  # a relay passes it up
            return
        if self._next_child is not None:
            await self._send(next(self._next_child), body)  # a relay passes it down
            return
        assert self.master is not None
        answer = {"kind": "response", "id": body["id"], "result": body["params"]}
        await self._send(self.master, answer)
