"""Figure 5: failure detection with real `vox-agent` daemons, against bare MQTT clients.

The seed tree (root -> coordinator -> spec_a, spec_b) runs as four daemon processes on the
rendered broker, heartbeat 1 s. Next to them two bare paho clients with a will and
the same keepalive stand for what plain MQTT detects. Faults are injected into a daemon and a
bare client at the same instant; an independent witness (the read-only explorer identity)
stamps what it receives on this process's monotonic clock:

- SIGKILL: the daemon's retained INACTIVE will, and its master's war-room alert;
- SIGSTOP (a frozen VM): the master's STALE alert (heartbeat rule) and the broker's will
  (keepalive rule: about 1.5 x keepalive plus the broker's check interval).

    python -m bench.detection [--quick]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

if __package__ in (None, ""):  # run as a script: make `bench` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BARE_CLIENT, figure, run_alone
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet
from tests.kits.recorder import Recorder, Seen, stated
from vox_mqtt.protocol import topics

HEARTBEAT = 1.0
STALE_AFTER = 3.0  # heartbeat intervals, the agents' default
BROKER_CHECK = 5.0  # seconds: how often Mosquitto may look at keepalives (docs/liveness.md)
IMMEDIATE = 1.0  # seconds: what "at once" is allowed to mean on a loaded 2-core machine
SHAPE = {
    "root": None,
    "coordinator": "root",
    "spec_a": "coordinator",
    "spec_b": "coordinator",
    "probe_kill": "root",  # identities for the bare clients; no daemon runs for them
    "probe_freeze": "root",
}
ROLES = {"spec_a": ["bench.voxside:Echo"], "spec_b": ["bench.voxside:Echo"]}
DAEMONS = ("root", "coordinator", "spec_a", "spec_b")


def keepalive_for(quick: bool) -> int:
    """Return the keepalive of daemons and bare clients (the daemon allows >= 2 s)."""
    return 2 if quick else 5


def arrival(
    recorder: Recorder, test: Callable[[str, bytes], bool], after: float, timeout: float
) -> float:
    """Return when the first message after `after` passing test arrived; fail on timeout."""
    what = getattr(test, "what", "message")
    seen = recorder.wait(
        lambda item: test(item.topic, item.payload), after=after, timeout=timeout, what=what
    )
    return seen.at


def status_is(agent: UUID, **expect: Any) -> Callable[[str, bytes], bool]:
    """Match a status (or presence: the will lands there) of agent holding every expected value."""
    wanted = {topics.status(agent), topics.presence(agent)}

    def test(topic: str, payload: bytes) -> bool:
        if topic not in wanted or not payload.startswith(b"{"):
            return False
        # A running agent's full status names no state (docs/liveness.md, "Which topic
        # tells"): read as the state it was published in, as the recorder kit does.
        details = stated(Seen(at=0.0, topic=topic, payload=payload, retain=False))
        return all(details.get(k) == v for k, v in expect.items())

    test.what = f"status {expect} of {agent}"  # type: ignore[attr-defined]
    return test


def warroom_post(master: UUID, subject: UUID, code: str | None = None) -> Callable[..., bool]:
    """Match the master's war-room post about subject (optionally with an error code)."""

    def test(topic: str, payload: bytes) -> bool:
        if topic != topics.warroom(master, subject) or not payload:
            return False
        return code is None or json.loads(payload)["details"].get("error_code") == code

    test.what = f"war-room post by {master} about {subject}"  # type: ignore[attr-defined]
    return test


@contextmanager
def bare_client(
    procs: FleetProcesses, name: str, keepalive: int
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a bare paho client as a fleet identity, with a will on its status topic."""
    creds = procs.broker_dir.credentials_for(name)
    # The broker locks client ids to usernames (docs/broker.md): the identity's own id.
    client_id = creds.username
    args = [str(procs.broker_dir.port), creds.username, creds.password, client_id, str(keepalive)]
    process = subprocess.Popen(
        [sys.executable, "-c", BARE_CLIENT, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while f"as {client_id}" not in procs.broker.log_text():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the bare client of {name} did not connect")
            time.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def _will_of(agent: UUID) -> Callable[[str, bytes], bool]:
    return lambda topic, payload: topic == topics.status(agent) and payload == b"gone"


def measure(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Inject the faults and time what the witness sees; one row per kind of detection."""
    keepalive = keepalive_for(quick)
    frozen_bound = 1.5 * keepalive + BROKER_CHECK
    stale_bound = STALE_AFTER * HEARTBEAT + HEARTBEAT / 4  # the reconcile tick
    toml = fleet_text(SHAPE, roles=ROLES, heartbeat=HEARTBEAT)
    with run_fleet(workdir, toml, keepalive=keepalive, start=False) as procs:
        fleet = procs.fleet
        ids = {spec.name: spec.id for spec in fleet}
        for name in sorted(DAEMONS, key=lambda n: -fleet.depth_of(ids[n])):
            procs.agents[name].start()
        explorer = procs.broker_dir.credentials_for("explorer")
        with (
            Recorder(
                port=procs.broker_dir.port,
                username=explorer.username,
                password=explorer.password or "",
                client_id=f"{explorer.username}-bench",
            ) as seen,
            bare_client(procs, "probe_kill", keepalive) as bare_kill,
            bare_client(procs, "probe_freeze", keepalive) as bare_freeze,
        ):
            arrival(seen, status_is(ids["root"], status="ACTIVE", commands=["echo"]), 0.0, 60.0)
            for name in DAEMONS:  # every master must hold its children ACTIVE before a fault
                arrival(seen, status_is(ids[name], status="ACTIVE"), 0.0, 30.0)
            time.sleep(3 * HEARTBEAT)
            coord, spec_a, spec_b = ids["coordinator"], ids["spec_a"], ids["spec_b"]

            killed = time.monotonic()
            procs.agents["spec_a"].process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            bare_kill.send_signal(signal.SIGKILL)
            gone = status_is(spec_a, status="INACTIVE", error_code="VM_CONNECTION_LOST")
            kill_will = arrival(seen, gone, killed, 10) - killed
            kill_alert = arrival(seen, warroom_post(coord, spec_a), killed, 10) - killed
            kill_raw = arrival(seen, _will_of(ids["probe_kill"]), killed, 10) - killed

            frozen = time.monotonic()
            procs.agents["spec_b"].signal(signal.SIGSTOP)
            bare_freeze.send_signal(signal.SIGSTOP)
            limit = frozen_bound + 10
            stale = arrival(seen, warroom_post(coord, spec_b, "HEARTBEAT_STALE"), frozen, limit)
            gone = status_is(spec_b, status="INACTIVE", error_code="VM_CONNECTION_LOST")
            frozen_will = arrival(seen, gone, frozen, limit) - frozen
            frozen_raw = arrival(seen, _will_of(ids["probe_freeze"]), frozen, limit) - frozen
            procs.agents["spec_b"].signal(signal.SIGCONT)
    stale_s = stale - frozen
    bounds = f"keepalive {keepalive} s, heartbeat {HEARTBEAT:g} s"
    return [
        figure(
            title="SIGKILL -> INACTIVE (retained will) seen",
            unit="s",
            vox=kill_will,
            baseline=kill_raw,
            target=f"immediate (<= {IMMEDIATE:g} s)",
            met=kill_will <= IMMEDIATE,
            baseline_is="a bare MQTT client's will, killed at the same instant",
            setting=bounds,
        ),
        figure(
            title="SIGKILL -> master's war-room alert",
            unit="s",
            vox=kill_alert,
            baseline=kill_raw,
            target=f"immediate (<= {IMMEDIATE:g} s)",
            met=kill_alert <= IMMEDIATE,
            baseline_is="a bare MQTT client's will (the earliest anyone can know)",
            setting=bounds,
        ),
        figure(
            title="SIGSTOP (frozen) -> master's STALE alert",
            unit="s",
            vox=stale_s,
            baseline=frozen_raw,
            target=f"<= 3 x heartbeat + reconcile tick = {stale_bound:g} s",
            met=stale_s <= stale_bound,
            baseline_is="a bare MQTT client's will after SIGSTOP (keepalive rule only)",
            setting=bounds,
        ),
        figure(
            title="SIGSTOP (frozen) -> INACTIVE (broker's will)",
            unit="s",
            vox=frozen_will,
            baseline=frozen_raw,
            target=f"<= 1.5 x keepalive + {BROKER_CHECK:g} s = {frozen_bound:g} s",
            met=frozen_will <= frozen_bound,
            baseline_is="a bare MQTT client's will after SIGSTOP, same keepalive",
            setting=bounds,
        ),
    ]


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Measure figure 5."""
    return measure(workdir, quick)


def main() -> int:
    """Run figure 5 alone and print it as JSON."""
    return run_alone(__doc__, run)


if __name__ == "__main__":
    raise SystemExit(main())
