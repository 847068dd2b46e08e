"""The baseline: the same routing with bare MQTT clients, no VOX envelope, ledger or acks.

Two raw clients, and each figure quotes the faster (its row says which): aiomqtt, what a
user would pick, and the transport's own connection (vox_mqtt/transport/wire.py) without
the session around it, the fastest raw client on the transport's path
(docs/transport.md, "Why this transport").

Each node logs in with a fleet identity (so the broker's ACL checks the same topics) under a
client id of its own, with TCP_NODELAY as the transport sets it, and publishes at QoS 1,
awaiting each PUBACK as `Session.publish` does. A request goes down the tree, a response
comes back up; relays decode the JSON body to tell the two apart, as an application would.

With a Journal, a node also does what the VOX contract obliges a hop to do, and nothing
else: every request is acknowledged or answered, no answer is acknowledged (its requester
re-sends the request until it has one, and the answerer replays the answer it recorded:
docs/messages.md), and each step commits to a SQLite file (WAL, synchronous=FULL) before
it publishes, in the groups docs/ledger.md gives: the request with its sent row; at the
requester, the answer's received (the answer seen before that commit, as VOX's caller sees
it); at the answering node, received + started + the reply's sent + completed (the quick
answer standing for its acknowledgement, as VOX's does for an idempotent command); at a
relay, received + the ack's sent + delegated + the downstream sent on the way down, and the
child's answer received + the reply's sent + completed on the way up. An ack's own row
waits for the next commit. A GroupJournal commits the steps of one turn of the loop
together (figure 3, under concurrent load). That is the floor a VOX hop cannot go under
with its guarantees, measured beside it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from bench.common import BenchBroker
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.settings import BrokerSettings
from vox_mqtt.transport.wire import Connection, Received, Subscription, connect

# The raw clients a baseline can run on (RawNode's `client`).
RAW_CLIENTS = ("aiomqtt", "wire")
_NO_PROPERTIES = b"\x00"

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


class Journal:
    """A minimal durable record: one table, one index, one fsynced commit per step."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, message_id TEXT, "
            "action TEXT, body BLOB)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS log_message ON log (message_id, action)")
        self._later: list[tuple[str, str, bytes]] = []

    def commit(self, *rows: tuple[str, str, bytes]) -> None:
        """Commit rows (and any waiting ones) in one durable transaction, on this thread."""
        batch, self._later = [*self._later, *rows], []
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO log (message_id, action, body) VALUES (?, ?, ?)", batch)
        self.db.execute("COMMIT")

    async def durable(self, *rows: tuple[str, str, bytes]) -> None:
        """Return once rows are committed: here at once, on this thread."""
        self.commit(*rows)

    def later(self, *rows: tuple[str, str, bytes]) -> None:
        """Keep rows for the next commit (an ack's own record: nothing waits for it)."""
        self._later.extend(rows)

    def close(self) -> None:
        """Close the file."""
        self.db.close()


class GroupJournal(Journal):
    """A Journal that commits every step waiting in one turn of the loop in one transaction.

    Group commit, as the VOX ledger's writer does: under concurrent load (figure 3) one
    fsync makes many steps durable, so the floor prices the guarantees, not a naive
    commit per step. Still on the loop's thread: no hand-off to pay for.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._waiting: list[asyncio.Future[None]] = []

    async def durable(self, *rows: tuple[str, str, bytes]) -> None:
        """Return once rows are committed, with every other step's of this turn."""
        self._later.extend(rows)
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        if len(self._waiting) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        await done

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        try:
            self.commit()
        except sqlite3.Error as exc:
            for done in waiting:
                done.set_exception(exc)
            return
        for done in waiting:
            done.set_result(None)


class WireClient:
    """The transport's bare connection with the few calls of aiomqtt's a RawNode makes."""

    def __init__(self, bench: BenchBroker, name: str) -> None:
        creds = bench.creds(name)
        self._settings = BrokerSettings(
            port=bench.port,
            username=creds.username,
            password=creds.password,
            client_id=f"{creds.username}-raw",
            keepalive=30,
        )
        self._link: Connection | None = None
        self._queue: asyncio.Queue[Received] = asyncio.Queue()

    async def __aenter__(self) -> WireClient:
        self._link = await connect(self._settings, will=None, tls=None, receive_maximum=100)
        self._link.sink = self._take
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._link is not None:
            await self._link.close()

    def _take(self, message: Received) -> bool:
        self._queue.put_nowait(message)
        return True  # acknowledged once queued, as aiomqtt acknowledges on receipt

    async def subscribe(self, topic: str, options: SubscribeOptions) -> None:
        assert self._link is not None
        await self._link.subscribe([Subscription(topic, qos=options.QoS)], timeout=10)

    async def publish(self, topic: str, payload: bytes, qos: int) -> None:
        assert self._link is not None
        outcome = await self._link.publish_checked(topic, payload, qos, False, _NO_PROPERTIES)
        if outcome is None or not outcome.accepted:
            raise RuntimeError(f"raw publish to {topic} not accepted: {outcome}")

    @property
    def messages(self) -> WireClient:
        return self

    def __aiter__(self) -> WireClient:
        return self

    async def __anext__(self) -> Received:
        return await self._queue.get()


class RawNode:
    """One bare MQTT client on the inbox topics of a fleet identity."""

    def __init__(
        self,
        bench: BenchBroker,
        name: str,
        *,
        master: str | None = None,
        children: tuple[str, ...] = (),
        journal: Journal | None = None,
        client: str = "aiomqtt",
    ) -> None:
        self.id = bench.id(name)
        self.master = None if master is None else bench.id(master)
        self.children = [bench.id(child) for child in children]
        self._next_child = itertools.cycle(self.children) if self.children else None
        self.client: aiomqtt.Client | WireClient
        if client == "wire":
            self.client = WireClient(bench, name)
        else:
            self.client = raw_client(bench, name, keepalive=30)
            # A relay under load has many publishes in flight by design; aiomqtt warns past 10.
            self.client.pending_calls_threshold = 10_000
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        self.handled = 0
        self.journal = journal

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
        if self.journal is not None:
            self.journal.close()

    async def request(self, to: UUID, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request down to a child and return the response that comes back."""
        request_id = str(uuid4())
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = waiter
        body = {"kind": "request", "id": request_id, "command": "echo", "params": params}
        try:
            if self.journal is not None:
                await self.journal.durable((request_id, "sent", json.dumps(body).encode()))
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
        if self.journal is not None:
            await self._handle_durably(body, bytes(payload))
            return
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

    async def _handle_durably(self, body: dict[str, Any], payload: bytes) -> None:
        """Record, acknowledge and pass on or answer a message, as a VOX hop must."""
        assert self.journal is not None
        journal, kind, message_id = self.journal, body["kind"], body["id"]
        if kind == "ack":
            journal.later((message_id, "acknowledged", payload))
            return
        if kind == "response":
            # An answer is never acknowledged (docs/messages.md): the request it answers
            # leaves the requester's outbox with its received row.
            waiter = self._waiting.get(message_id)
            rows = [(message_id, "received", payload)]
            if waiter is not None:
                # The caller sees the answer before its record commits, as VOX's does
                # (docs/ledger.md).
                if not waiter.done():
                    waiter.set_result(body)
                await journal.durable(*rows)
                return
            assert self.master is not None  # a relay passes it up, as its own reply
            up = {**body, "from": str(self.id)}
            rows += [(message_id, "reply sent", json.dumps(up).encode())]
            await journal.durable(*rows, (message_id, "completed", b""))
            await self._send(self.master, up)
            return
        ack = json.dumps({"kind": "ack", "id": message_id}).encode()
        source = self.master
        assert source is not None
        if self._next_child is not None:  # a relay: delegate
            await journal.durable(
                (message_id, "received", payload),
                (message_id, "ack sent", ack),
                (message_id, "delegated", b""),
                (message_id, "sent", payload),
            )
            await self.client.publish(topics.inbox(source, self.id), ack, qos=1)
            await self._send(next(self._next_child), body)
            return
        answer = {
            "kind": "response",
            "id": message_id,
            "result": body["params"],
            "from": str(self.id),
        }
        # A quick answer to an idempotent command stands for its acknowledgement, as VOX's
        # does (docs/messages.md): one commit holds the request, its start and the answer.
        await journal.durable(
            (message_id, "received", payload),
            (message_id, "started", b""),
            (message_id, "reply sent", json.dumps(answer).encode()),
            (message_id, "completed", b""),
        )
        await self._send(source, answer)
