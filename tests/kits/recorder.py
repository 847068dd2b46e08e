"""A raw MQTT recorder of every status and war-room message, for tests and benchmarks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from vox_mqtt.protocol import topics


@dataclass
class Seen:
    """One message the recorder received, stamped on the test's monotonic clock."""

    at: float
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.payload)
        return data


@dataclass
class Recorder:
    """A read-only identity (the explorer) recording every status and war-room message.

    A raw paho client, independent of vox_mqtt's transport: what it saw, the broker sent.
    """

    port: int
    username: str
    password: str
    client_id: str
    seen: list[Seen] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _client: Any = None

    def __enter__(self) -> Recorder:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5
        )
        client.username_pw_set(self.username, self.password)
        wanted = [(f, 1) for f in (*topics.LIVENESS_FILTERS, topics.WARROOM_FILTER)]
        client.on_connect = lambda c, *_: c.subscribe(wanted)
        client.on_message = self._on_message
        client.reconnect_delay_set(min_delay=0.1, max_delay=1)  # type: ignore[arg-type]
        client.connect("127.0.0.1", self.port, keepalive=30)
        client.loop_start()
        self._client = client
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def _on_message(self, _client: Any, _userdata: Any, msg: Any) -> None:
        with self._cond:
            self.seen.append(Seen(time.monotonic(), msg.topic, msg.payload, bool(msg.retain)))
            self._cond.notify_all()

    def wait(
        self,
        predicate: Callable[[Seen], bool],
        *,
        after: float = 0.0,
        timeout: float = 10.0,
        what: str = "a matching message",
    ) -> Seen:
        """Return the first message after `after` that satisfies predicate; fail on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for item in self.seen:
                    if item.at >= after and predicate(item):
                        return item
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"the recorder saw no {what} within {timeout:g}s")
                self._cond.wait(min(remaining, 0.2))

    def status(
        self,
        agent: UUID,
        *,
        after: float = 0.0,
        timeout: float = 10.0,
        min_epoch: int = 0,
        **expect: Any,
    ) -> Seen:
        """Wait for a status of agent whose details hold every expected key=value.

        Its presence counts too: the will lands there (docs/liveness.md).
        """
        wanted = {topics.status(agent), topics.presence(agent)}

        def matches(item: Seen) -> bool:
            if item.topic not in wanted or not item.payload:
                return False
            details = stated(item)
            if details["epoch"] < min_epoch:
                return False
            return all(details.get(k) == v for k, v in expect.items())

        return self.wait(matches, after=after, timeout=timeout, what=f"status {expect} of {agent}")

    def latest_status(self, agent: UUID) -> dict[str, Any]:
        """Return the details of the last status of agent received so far."""
        with self._cond:
            for item in reversed(self.seen):
                if item.topic == topics.status(agent) and item.payload:
                    details: dict[str, Any] = item.json()["details"]
                    return details
        raise AssertionError(f"no status of {agent} yet")

    def warroom(self, source: UUID, subject: UUID, *, after: float = 0.0) -> list[Seen]:
        """Return the war-room posts (and clears) about subject by source, after a time."""
        topic = topics.warroom(source, subject)
        with self._cond:
            return [item for item in self.seen if item.topic == topic and item.at >= after]

    def wait_warroom(
        self,
        source: UUID,
        subject: UUID,
        *,
        resolved: bool | None = False,
        after: float = 0.0,
        timeout: float = 10.0,
    ) -> Seen:
        """Wait for a post (resolved False/True) or, with resolved=None, the retained clear."""
        topic = topics.warroom(source, subject)

        def matches(item: Seen) -> bool:
            if item.topic != topic:
                return False
            if resolved is None:
                return item.payload == b""
            return bool(item.payload) and item.json()["details"].get("resolved", False) == resolved

        return self.wait(matches, after=after, timeout=timeout)


def stated(item: Seen) -> dict[str, Any]:
    """Return a status's details with the state its agent was in when it published it.

    A running agent's full status carries no state word (docs/liveness.md, "Which topic
    tells"): published only while it runs, it is ACTIVE, or DEGRADED with its error code.
    """
    details: dict[str, Any] = dict(item.json()["details"])
    if item.topic.endswith("/status") and "status" not in details:
        details["status"] = "DEGRADED" if details.get("error_code") else "ACTIVE"
    return details
