"""An identity with the broker's power: it may read and write every topic (docs/security.md).

With it, what the signature tests read of a live fleet: ledgers, rejections, views.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.kits.fleetproc import FleetProcesses, fleet_text, wait_until
from vox_mqtt.broker.render import BrokerDir
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.messages import now_iso

ATTACKER = "attacker"
ATTACKER_PASSWORD = "all-powerful-secret"

# The fleet the signature tests attack: two analysts under a coordinator under the root.
SHAPE: dict[str, str | None] = {
    "root": None,
    "coord": "root",
    "spec_a": "coord",
    "spec_b": "coord",
}
ANALYST = ["tests.kits.agentkit:Analyst"]


def target_fleet(signatures: str, replay_window: float | None = None) -> str:
    """Return that fleet's text, with its signatures mode (and replay window)."""
    head = f'signatures = "{signatures}"\n'
    if replay_window is not None:
        head += f"replay_window = {replay_window}\n"
    return head + fleet_text(SHAPE, roles={"spec_a": ANALYST, "spec_b": ANALYST})


def add_attacker(broker_dir: BrokerDir) -> None:
    """Give the rendered broker one more login that may read and write everything."""
    assert broker_dir.acl is not None, "acl format only"
    assert broker_dir.passwd is not None
    with broker_dir.acl.open("a") as acl:
        acl.write(f"\nuser {ATTACKER}\ntopic readwrite #\n")
    subprocess.run(
        ["mosquitto_passwd", "-b", str(broker_dir.passwd), ATTACKER, ATTACKER_PASSWORD],
        check=True,
        capture_output=True,
        timeout=20,
    )


@dataclass
class Captured:
    """One message the attacker saw, with its user properties."""

    topic: str
    payload: bytes
    retain: bool
    user_properties: list[tuple[str, str]]


@dataclass
class Attacker:
    """A raw paho MQTT v5 client logged in as the attacker, capturing everything on `#`."""

    port: int
    seen: list[Captured] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=ATTACKER, protocol=mqtt.MQTTv5
        )
        self.client.username_pw_set(ATTACKER, ATTACKER_PASSWORD)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", self.port, keepalive=30)
        self.client.loop_start()
        deadline = time.monotonic() + 10
        while not self.client.is_connected():
            assert time.monotonic() < deadline, "the attacker could not log in"
            time.sleep(0.02)
        _, mid = self.client.subscribe("#", qos=1)
        assert mid is not None

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        pairs = list(getattr(message.properties, "UserProperty", None) or [])
        with self._lock:
            self.seen.append(Captured(message.topic, bytes(message.payload), message.retain, pairs))

    def captured(self) -> list[Captured]:
        """Return what it saw so far."""
        with self._lock:
            return list(self.seen)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        user_properties: list[tuple[str, str]] | None = None,
        retain: bool = False,
    ) -> None:
        """Publish at QoS 1 and wait until the broker took it (its ACL lets it write all)."""
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ContentType = "application/json"
        if user_properties:
            props.UserProperty = user_properties
        info = self.client.publish(topic, payload, qos=1, retain=retain, properties=props)
        info.wait_for_publish(10)
        assert info.is_published(), f"the broker did not take the attacker's {topic}"

    def close(self) -> None:
        """Disconnect."""
        self.client.disconnect()
        self.client.loop_stop()


def raw_envelope(
    kind: str, source: Any, target: Any, details: dict[str, Any], **extra: Any
) -> bytes:
    """Return a message as an attacker writes it: any JSON, never through the models."""
    message = {
        "message_id": str(uuid4()),
        "message_source": "vox-mqtt",
        "emitted_at": now_iso(),
        "source": str(source),
        "target": str(target),
        "type": kind,
        "details": details,
        **extra,
    }
    return json.dumps(message).encode()


async def rows_of(path: Path) -> list[dict[str, Any]]:
    """Return a ledger's rows, newest first, read-only."""
    async with VOXAgentMemory(path, read_only=True) as memory:
        return await memory.get_recent(10_000)


def ledger(procs: FleetProcesses, name: str) -> list[dict[str, Any]]:
    """Read an agent's ledger (read-only, beside the running daemon), from any thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, rows_of(procs.ledger(name))).result(30)


def rejected(procs: FleetProcesses, name: str) -> list[str]:
    """Return the reasons of every message an agent's ledger recorded rejected."""
    return [str(r["reason"]) for r in ledger(procs, name) if r["action"] == "rejected"]


def command_capture(attacker: Attacker, ids: dict[str, UUID]) -> tuple[Captured, str, str]:
    """Return the command a coordinator sent a specialist, with their names."""
    names = {str(v): k for k, v in ids.items()}
    for seen in attacker.captured():
        parts = seen.topic.split("/")
        to_spec = len(parts) == 4 and names.get(parts[1], "").startswith("spec")
        if to_spec and json.loads(seen.payload)["type"] == "command_request":
            return seen, names[parts[1]], names[parts[3]]
    raise AssertionError("no command to a specialist was captured")


def wait_rejected(procs: FleetProcesses, name: str, count: int) -> list[str]:
    """Wait until an agent recorded count rejections; return their reasons."""
    wait_until(lambda: len(rejected(procs, name)) >= count, 20, f"{count} rejections at {name}")
    return rejected(procs, name)


async def wait_view(
    console: OperatorConsole, agent: UUID, status: str, *, timeout: float = 20
) -> None:
    """Wait until the console's view shows an agent in a state."""
    async with asyncio.timeout(timeout):
        while True:
            entry = console.view.get(agent)
            if entry is not None and entry.status == status:
                return
            await asyncio.sleep(0.05)
