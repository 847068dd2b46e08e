"""Helpers for tests that need the fleet's real, secured broker and clients that log into it.

- `tree_fleet(...)`: a fleet of named agents in a given shape.
- `start_secure_broker(factory, fleet, out_dir, ...)`: render with `render_broker_dir`
  (run as the current user, so a root test run can read the 0600 files) and start it.
- `Client`: a blocking paho MQTT v5 client that reports PUBACK/SUBACK reason codes.
- `Witness`: an independent `mosquitto_sub` process that records what it receives.
"""

from __future__ import annotations

import getpass
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.protocol.hierarchy import Fleet, parse_fleet
from vox_mqtt.protocol.messages import (
    MAX_MESSAGE_BYTES,
    MSG_AGENT_STATUS,
    new_message,
    now_iso,
    serialize,
)

GRANTED_QOS1 = 0x01
NOT_AUTHORIZED = 0x87
SUCCESS = 0x00
NO_MATCHING_SUBSCRIBERS = 0x10
# The seed's tree: a root, a coordinator, two specialists under it.
SEED_TREE: dict[str, str | None] = {
    "root": None,
    "coordinator": "root",
    "specialist_a": "coordinator",
    "specialist_b": "coordinator",
}


def tree_fleet(shape: dict[str, str | None], *, operator: str = "operator") -> Fleet:
    """Return a fleet from {name: master name or None}, with fresh UUIDs."""
    ids = {name: uuid4() for name in shape}
    parts = [f'[operator]\nname = "{operator}"\nid = "{uuid4()}"\n']
    for name, master in shape.items():
        master_line = "" if master is None else f'master_id = "{ids[master]}"\n'
        parts.append(f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"\n{master_line}')
    return parse_fleet("\n".join(parts))


def fleet_toml(fleet: Fleet, extra: dict[str, tuple[UUID, UUID]] | None = None) -> str:
    """Return fleet-file text for a fleet, plus extra agents {name: (id, master id)}."""
    parts = [f'[operator]\nname = "{fleet.operator_name}"\nid = "{fleet.operator_id}"\n']
    rows = [(a.name, a.id, a.master_id) for a in fleet]
    rows += [(name, ids[0], ids[1]) for name, ids in (extra or {}).items()]
    for name, agent_id, master in rows:
        master_line = "" if master is None else f'master_id = "{master}"\n'
        parts.append(f'[[agents]]\nname = "{name}"\nid = "{agent_id}"\n{master_line}')
    return "\n".join(parts)


def add_agent(fleet: Fleet, name: str, master: str) -> Fleet:
    """Return the same fleet (same ids) with one more agent under master."""
    return parse_fleet(fleet_toml(fleet, {name: (uuid4(), fleet.agent(master).id)}))


def seven_agent_fleet() -> Fleet:
    """Return the 3-level test tree: root; coord_a, coord_b; two specialists under each."""
    return tree_fleet(
        {
            "root": None,
            "coord_a": "root",
            "coord_b": "root",
            "spec_a1": "coord_a",
            "spec_a2": "coord_a",
            "spec_b1": "coord_b",
            "spec_b2": "coord_b",
        }
    )


@dataclass
class SecureBroker:
    """A running broker rendered from a fleet, and its directory."""

    broker: LocalBroker
    dir: BrokerDir
    fleet: Fleet

    def creds(self, key: str | UUID) -> Credentials:
        """Return the plain-listener credentials of an identity (by name or UUID)."""
        creds = self.dir.credentials_for(key)
        return Credentials(
            username=creds.username, password=creds.password, host="127.0.0.1", port=self.dir.port
        )

    def tls_creds(self, key: str | UUID) -> Credentials:
        """Return the TLS-listener credentials of an identity."""
        return self.dir.credentials_for(key)


def rerender(secure: SecureBroker, fleet: Fleet, *, rotate: tuple[str, ...] = ()) -> None:
    """Render a changed fleet into the running broker's directory, as an operator would."""
    secure.dir = render_broker_dir(
        fleet,
        secure.dir.root,
        port=secure.dir.port,
        explorer=True,
        run_as_user=getpass.getuser(),
        rotate_names=rotate,
    )


def reload_broker(secure: SecureBroker, *extra: str, pid: int | None = None) -> int:
    """Run `vox broker reload DIR --pid PID ...` against the running broker."""
    from vox_mqtt.cli import main

    target = str(secure.broker.pid if pid is None else pid)
    return main(["broker", "reload", str(secure.dir.root), "--pid", target, *extra])


def start_secure_broker(
    factory: Callable[..., LocalBroker],
    fleet: Fleet,
    out_dir: Path,
    *,
    fmt: str = "acl",
    pki_dir: Path | None = None,
    explorer: bool = True,
    lock_client_ids: bool = True,
) -> SecureBroker:
    """Render the fleet's broker dir into out_dir and start mosquitto from its conf."""
    port = free_port()
    broker_dir = render_broker_dir(
        fleet,
        out_dir,
        port=port,
        fmt=fmt,  # type: ignore[arg-type]
        pki_dir=pki_dir,
        tls_port=free_port(),
        explorer=explorer,
        run_as_user=getpass.getuser(),
        lock_client_ids=lock_client_ids,
    )
    broker = factory(broker_dir.conf.read_text(), port=port)
    return SecureBroker(broker=broker, dir=broker_dir, fleet=fleet)


@dataclass
class Received:
    """One message a Client received."""

    topic: str
    payload: bytes
    retain: bool


@dataclass
class Client:
    """A blocking MQTT v5 client on paho that exposes the broker's reason codes."""

    creds: Credentials
    tls: bool = False
    will: tuple[str, bytes] | None = None
    client_id: str | None = None  # default: the username, as the broker enforces anyway
    anonymous: bool = False
    timeout: float = 10.0
    session_expiry: int = 0  # > 0: a persistent session, resumed (clean_start False)
    messages: list[Received] = field(default_factory=list)
    _acks: dict[int, int] = field(default_factory=dict)
    _subacks: dict[int, list[int]] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _connack: int | None = None
    session_present: bool = False
    _paho: Any = None

    def connect(self) -> int:
        """Connect and return the CONNACK reason code (0 = accepted); never retries."""
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id or self.creds.username,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        if not self.anonymous:
            client.username_pw_set(self.creds.username, self.creds.password)
        if self.tls:
            client.tls_set(
                ca_certs=str(self.creds.ca_file),
                certfile=None if self.creds.cert_file is None else str(self.creds.cert_file),
                keyfile=None if self.creds.key_file is None else str(self.creds.key_file),
            )
        if self.will is not None:
            client.will_set(self.will[0], self.will[1], qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect
        self._paho = client
        properties = None
        if self.session_expiry:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self.session_expiry
        client.connect(
            self.creds.host,
            self.creds.port,
            keepalive=30,
            clean_start=not self.session_expiry,
            properties=properties,
        )
        client.loop_start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._connack is not None, self.timeout):
                raise TimeoutError(f"no CONNACK for {self.creds.username}")
        assert self._connack is not None
        return self._connack

    def _on_connect(self, _c: Any, _u: Any, flags: Any, rc: Any, _p: Any) -> None:
        with self._cond:
            self.session_present = bool(flags.session_present)
            self._connack = rc.value
            self._cond.notify_all()

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        with self._cond:
            if self._connack is None:
                self._connack = rc.value if rc.value else NOT_AUTHORIZED
            self._cond.notify_all()

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        with self._cond:
            self._acks[mid] = rc.value
            self._cond.notify_all()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        with self._cond:
            self._subacks[mid] = [code.value for code in codes]
            self._cond.notify_all()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self._cond:
            self.messages.append(Received(msg.topic, msg.payload, bool(msg.retain)))
            self._cond.notify_all()

    def publish_many(
        self, items: Iterable[tuple[str, bytes]], *, retain: bool = False
    ) -> list[int]:
        """Publish at QoS 1 and return each PUBACK reason code, in order."""
        mids = [
            self._paho.publish(topic, payload, qos=1, retain=retain).mid for topic, payload in items
        ]
        with self._cond:
            if not self._cond.wait_for(lambda: all(m in self._acks for m in mids), self.timeout):
                raise TimeoutError(f"{len(mids)} publishes not all acknowledged")
            return [self._acks.pop(m) for m in mids]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Publish one message at QoS 1 and return its PUBACK reason code."""
        return self.publish_many([(topic, payload)], retain=retain)[0]

    def subscribe(self, filters: Sequence[str]) -> list[int]:
        """Subscribe to filters at QoS 1 in one SUBSCRIBE; return the SUBACK codes."""
        _, mid = self._paho.subscribe([(f, 1) for f in filters])
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._subacks, self.timeout):
                raise TimeoutError("no SUBACK")
            return self._subacks.pop(mid)

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 5.0) -> bool:
        """Wait until predicate(messages) holds; return False after timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.messages), timeout)

    def wait_payload(self, payload: bytes, timeout: float = 5.0) -> bool:
        """Wait until a message with this payload has arrived."""
        return self.wait_for(lambda ms: any(m.payload == payload for m in ms), timeout)

    @property
    def connected(self) -> bool:
        """Return whether the session is still up."""
        return self._paho is not None and bool(self._paho.is_connected())

    def drop(self) -> None:
        """Cut the TCP connection without DISCONNECT, as a crash would: the will fires."""
        if self._paho is not None:
            self._paho.socket().shutdown(socket.SHUT_RDWR)
            self._paho.loop_stop()
            self._paho = None

    def close(self) -> None:
        """Disconnect cleanly and stop the network thread."""
        if self._paho is not None:
            self._paho.disconnect()
            self._paho.loop_stop()
            self._paho = None


def try_connect(creds: Credentials, *, tls: bool = False) -> int | str:
    """Return the CONNACK code of a login attempt, or the TLS/socket error's name."""
    client = Client(creds, tls=tls, timeout=5.0)
    try:
        return client.connect()
    except (ssl.SSLError, OSError) as exc:
        return type(exc).__name__
    finally:
        client.close()


class Witness:
    """An independent `mosquitto_sub` that prints every message it receives."""

    def __init__(
        self,
        creds: Credentials,
        topic_filter: str,
        *,
        tls: bool = False,
        fmt: str | None = None,
        session_expiry: int | None = None,
    ) -> None:
        """Subscribe; a line is `topic payload`, or as `mosquitto_sub -F fmt` when fmt is given.

        session_expiry: keep a session on the broker for that many seconds, so what is
        published while the witness reconnects (a broker restart) is queued for it.
        """
        args = [
            "mosquitto_sub",
            "-h",
            creds.host,
            "-p",
            str(creds.port),
            "-V",
            "5",
            "-q",
            "1",
            "-t",
            topic_filter,
            *(("-v",) if fmt is None else ("-F", fmt)),
            "-i",
            creds.username,
        ]
        if session_expiry is not None:
            args += ["-c", "-x", str(session_expiry)]
        if tls:
            args += [
                "--cafile",
                str(creds.ca_file),
                "--cert",
                str(creds.cert_file),
                "--key",
                str(creds.key_file),
            ]
        else:
            args += ["-u", creds.username, "-P", creds.password]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def sync(self, publisher: Client, topic: str, timeout: float = 10.0) -> None:
        """Publish markers from publisher until the witness sees one: all earlier traffic is in."""
        marker = f"sync-{uuid4()}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            publisher.publish(topic, marker.encode())
            with self._cond:
                if self._cond.wait_for(lambda: any(marker in ln for ln in self.lines), 0.2):
                    return
            if self._proc.poll() is not None:
                break
        raise AssertionError(f"witness saw no marker: {self.stderr()}")

    def wait_first(self, timeout: float = 10.0) -> bool:
        """Wait until the witness printed anything (e.g. a retained message)."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self.lines), timeout)

    def wait_line(self, line: str, timeout: float = 10.0) -> bool:
        """Wait until the witness printed exactly this `topic payload` line."""
        with self._cond:
            return self._cond.wait_for(lambda: line in self.lines, timeout)

    def stderr(self) -> str:
        """Return what mosquitto_sub wrote on stderr (after it stopped)."""
        if self._proc.poll() is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read()

    def close(self) -> None:
        """Stop mosquitto_sub."""
        self._proc.terminate()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        self._reader.join(5)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


def publish_as_identity(
    *, port: int, username: str, password: str, topic: str, payload: bytes, tmp: Path
) -> None:
    """Publish one retained message with `mosquitto_pub` under an identity's credentials."""
    path = tmp / f"{uuid4()}.json"
    path.write_bytes(payload)
    done = subprocess.run(
        [
            *("mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", "5"),
            # A client id of its own; a broker that locks ids to usernames (the default)
            # makes this a takeover of the real agent's session, which then reconnects.
            *("-u", username, "-P", password, "-i", f"{username}-x"),
            *("-q", "1", "-r", "-t", topic, "-f", str(path)),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def inflated_status(fleet: Fleet, name: str) -> bytes:
    """Return F3's status of an agent: huge epoch and interval, commands padded to the limit."""
    agent = fleet.agent(name)
    master = agent.master_id
    assert master is not None
    details: dict[str, Any] = {
        "name": name,
        "status": "ACTIVE",
        "epoch": 10**6,
        "started_at": now_iso(),
        "heartbeat_interval": 1e9,
        "commands": [],
    }

    def build() -> bytes:
        message = new_message(MSG_AGENT_STATUS, source=agent.id, target=master, details=details)
        return serialize(message)

    room = MAX_MESSAGE_BYTES - 200 - len(build())
    details["commands"] = [f"c{i:05d}" + "x" * 94 for i in range(room // 103)]
    payload = build()
    assert MAX_MESSAGE_BYTES - 400 < len(payload) <= MAX_MESSAGE_BYTES
    return payload
