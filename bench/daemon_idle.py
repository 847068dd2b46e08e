"""An idle vox-agent's footprint: resident memory and CPU over a quiet minute.

    python -m bench.daemon_idle [--seconds 60] [--heartbeat 15] [--json]

Runs one real daemon (the root of a two-agent fleet) against a private Mosquitto with the
generated ACL, as systemd would: $NOTIFY_SOCKET and WATCHDOG_USEC=30 s (the unit's
WatchdogSec). After READY and a settling pause, it samples the process with psutil: RSS
and USS at the start and the end of the window, and the CPU time used within it. A bare
paho client process (login, will, keepalive; nothing else) is sampled in the same window.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import psutil

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BARE_CLIENT
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import parse_fleet

SETTLE = 5.0  # seconds after READY before measuring: imports done, first heartbeat out


def _fleet_text(heartbeat: float) -> str:
    root = uuid4()
    return (
        f'[operator]\nid = "{uuid4()}"\n\n'
        f'[[agents]]\nname = "root"\nid = "{root}"\nheartbeat_interval = {heartbeat}\n\n'
        f'[[agents]]\nname = "leaf"\nid = "{uuid4()}"\nmaster_id = "{root}"\n'
    )


def _wait_ready(sock: socket.socket, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited with {process.returncode}")
        try:
            if b"READY=1" in sock.recv(4096).split(b"\n"):
                return
        except TimeoutError:
            continue
    raise SystemExit(f"no READY=1 within {timeout}s")


def measure(seconds: float, heartbeat: float, workdir: Path) -> dict[str, Any]:
    """Start broker and daemon, wait for READY, and measure the daemon for `seconds`."""
    fleet = parse_fleet(_fleet_text(heartbeat))
    broker_dir = render_broker_dir(
        fleet, workdir / "broker", port=free_port(), run_as_user=getpass.getuser()
    )
    config = render_agent_config(
        fleet, "root", broker_dir.root, workdir / "etc" / "root.toml", workdir / "state"
    ).config
    notify_path = workdir / "notify.sock"
    with (
        LocalBroker(broker_dir.conf, port=broker_dir.port),
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify,
    ):
        notify.bind(str(notify_path))
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="30000000")
        with (workdir / "daemon.log").open("wb") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "agent_daemon", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        creds = broker_dir.credentials_for("leaf")
        bare = subprocess.Popen(
            [sys.executable, "-c", BARE_CLIENT, str(broker_dir.port), creds.username,
             creds.password, f"{creds.username}-bare", "30"],
        )  # fmt: skip
        try:
            _wait_ready(notify, daemon, 30.0)
            time.sleep(SETTLE)
            proc, bare_proc = psutil.Process(daemon.pid), psutil.Process(bare.pid)
            before_mem = proc.memory_full_info()
            before_cpu, bare_before = proc.cpu_times(), bare_proc.cpu_times()
            started = time.monotonic()
            time.sleep(seconds)
            elapsed = time.monotonic() - started
            after_cpu, bare_after = proc.cpu_times(), bare_proc.cpu_times()
            after_mem, bare_mem = proc.memory_full_info(), bare_proc.memory_full_info()
            threads = proc.num_threads()
        finally:
            daemon.terminate()
            daemon.wait(30)
            bare.kill()
            bare.wait(10)
    cpu = (after_cpu.user - before_cpu.user) + (after_cpu.system - before_cpu.system)
    bare_cpu = (bare_after.user - bare_before.user) + (bare_after.system - bare_before.system)
    return {
        "bare_client_rss_mib": round(bare_mem.rss / 2**20, 1),
        "bare_client_cpu_seconds": round(bare_cpu, 3),
        "seconds": round(elapsed, 1),
        "heartbeat_interval": heartbeat,
        "rss_mib_start": round(before_mem.rss / 2**20, 1),
        "rss_mib_end": round(after_mem.rss / 2**20, 1),
        "uss_mib_end": round(after_mem.uss / 2**20, 1),
        "cpu_seconds": round(cpu, 3),
        "cpu_percent_of_one_core": round(100 * cpu / elapsed, 3),
        "threads": threads,
        "exit_code": daemon.returncode,
    }


def main() -> int:
    """Run the measurement and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measuring window")
    parser.add_argument("--heartbeat", type=float, default=15.0, help="heartbeat interval, s")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vox-idle-") as tmp:
        result = measure(args.seconds, args.heartbeat, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"idle vox-agent over {result['seconds']} s (heartbeat {args.heartbeat:g} s):")
        print(
            f"  RSS {result['rss_mib_start']} -> {result['rss_mib_end']} MiB "
            f"(USS {result['uss_mib_end']} MiB), {result['threads']} threads"
        )
        print(f"  CPU {result['cpu_seconds']} s = {result['cpu_percent_of_one_core']}% of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
