"""How long `vox warroom --follow` takes to end after SIGINT, beside a loaded machine.

    python -m bench.shutdown [--runs 200] [--spinners 1] [--rate 50] [--json]

Each run starts the console script `vox warroom --follow --json` as the operator of the seed
fleet, against a private Mosquitto rendered from it, while an agent's identity publishes
statuses at --rate per second at QoS 1 (the follower reads and acknowledges them: SIGINT
lands while messages come and go). Once the follower holds its connection and a random
0.3-1.5 s has passed, it gets SIGINT; the time from the signal to the exit is measured.
--spinners N keeps N cores busy (`python -c 'while 1: pass'`) all along. Reported: how many
runs ended within 2 s (the bound of docs/operations.md, "Interrupting a command"), their exit
codes, the median, the 99th percentile and the maximum.

Not part of the test suite: tests/integration/test_shutdown_bounded.py checks the bound
against a frozen, gone or stuck broker; this gives the figure over many runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SEED_SHAPE, BenchBroker, bench_broker, fleet_text, percentile
from bench.report import REPO
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, new_message, now_iso, serialize

BOUND = 2.0  # seconds from SIGINT to the exit (docs/operations.md)
PATIENCE = 60.0  # a run that has not ended by then is killed and counted as such
VOX = Path(sys.executable).parent / "vox"


@contextlib.contextmanager
def spinners(count: int) -> Iterator[None]:
    """Keep count cores busy with spinning processes while the block runs."""
    spun = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spun:
            process.kill()
            process.wait()


def status(agent: UUID, master: UUID, beat: int) -> bytes:
    """Return an ACTIVE status of the agent, as its daemon would publish it."""
    details = {
        "name": "spec_a",
        "status": "ACTIVE",
        "epoch": 1,
        "started_at": now_iso(),
        "heartbeat_interval": 15.0,
        "commands": [f"beat{beat}"],
    }
    return serialize(new_message(MSG_AGENT_STATUS, source=agent, target=master, details=details))


@contextlib.contextmanager
def traffic(bench: BenchBroker, agent: str, rate: float) -> Iterator[None]:
    """Publish a status of the agent rate times a second at QoS 1 while the block runs."""
    creds = bench.creds(agent)
    username, password = creds.username, creds.password
    spec = bench.fleet.agent(agent)
    assert spec.master_id is not None
    agent_id, master = spec.id, spec.master_id
    stop = threading.Event()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"{username}-bench", protocol=mqtt.MQTTv5
    )
    client.username_pw_set(username, password)
    client.connect("127.0.0.1", bench.port)
    client.loop_start()

    def publish() -> None:
        n = 0
        while not stop.wait(1.0 / rate):
            n += 1
            client.publish(topics.status(agent_id), status(agent_id, master, n), qos=1)

    thread = threading.Thread(target=publish, daemon=True)
    if rate > 0:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if rate > 0:
            thread.join(5)
        client.loop_stop()
        client.disconnect()


def connected(pid: int, port: int) -> bool:
    """Return whether the process holds an established connection to port."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.raddr and c.raddr.port == port and c.status == "ESTABLISHED" for c in conns)


def one_run(config: Path, port: int, env: dict[str, str]) -> tuple[float, int | None]:
    """Start a follower, SIGINT it once it follows; return (seconds to exit, exit code)."""
    process = subprocess.Popen(
        [str(VOX), "warroom", "--config", str(config), "--follow", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        env=env, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + PATIENCE
        while not connected(process.pid, port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the follower never connected (exit {process.returncode})")
            time.sleep(0.02)
        time.sleep(random.uniform(0.3, 1.5))
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        try:
            process.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            return PATIENCE, None
        return time.monotonic() - sent, process.returncode
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def measure(workdir: Path, runs: int, spin: int, rate: float) -> dict[str, Any]:
    """Run the follower `runs` times against one broker; return the figures."""
    text = fleet_text(SEED_SHAPE)
    with bench_broker(workdir, text) as bench:
        config = render_agent_config(
            bench.fleet, "operator", bench.root, workdir / "etc" / "operator.toml",
            workdir / "console",
        ).config  # fmt: skip
        # The children run this tree, unless PYTHONPATH names another one.
        env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(REPO))
        times: list[float] = []
        codes: Counter[str] = Counter()
        with (
            spinners(spin),
            traffic(bench, "spec_a", rate),
        ):
            for i in range(runs):
                took, code = one_run(config, bench.port, env)
                times.append(took)
                codes[str(code)] += 1
                print(f"run {i + 1}/{runs}: {took:.3f}s exit {code}", file=sys.stderr)
    return {
        "runs": runs,
        "spinners": spin,
        "status_rate_per_s": rate,
        "within_2s": sum(t < BOUND for t in times),
        "median_s": round(statistics.median(times), 3),
        "p99_s": round(percentile(times, 0.99), 3),
        "max_s": round(max(times), 3),
        "exit_codes": dict(codes),
    }


def main() -> int:
    """Run the figure from the command line and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--spinners", type=int, default=1, help="cores kept busy meanwhile")
    parser.add_argument("--rate", type=float, default=50.0, help="statuses per second, QoS 1")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vox-bench-") as tmp:
        result = measure(Path(tmp), args.runs, args.spinners, args.rate)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['within_2s']}/{result['runs']} ended within {BOUND:g}s of SIGINT "
            f"(median {result['median_s']}s, p99 {result['p99_s']}s, max {result['max_s']}s; "
            f"exit codes {result['exit_codes']}; {args.spinners} core(s) kept busy)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
