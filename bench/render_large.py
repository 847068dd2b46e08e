"""Figure 7: time `render_broker_dir` on a generated fleet (default 10,000 agents).

    .venv/bin/python -m bench.render_large [--agents N] [--fanout K] [--check]

Prints the time of each step: parsing the fleet file, the first render (every
secret new, every `$7$` hash computed), a re-render (secrets kept, each hash
verified instead), the dynsec render, and with --check, how long Mosquitto
itself takes to start on the result.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import figure
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.render import Format, render_broker_dir
from vox_mqtt.protocol.hierarchy import parse_fleet


def tree_toml(agents: int, fanout: int) -> str:
    """Return a fleet file of `agents` agents, each master with up to `fanout` children."""
    ids = [uuid4() for _ in range(agents)]
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n']
    for index, agent_id in enumerate(ids):
        master = "" if index == 0 else f'master_id = "{ids[(index - 1) // fanout]}"\n'
        parts.append(f'[[agents]]\nname = "agent-{index}"\nid = "{agent_id}"\n{master}')
    return "\n".join(parts)


def timed(label: str, func):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = func()
    print(f"{label:<44} {time.perf_counter() - start:8.2f} s", flush=True)
    return result


def cpu_seconds() -> float:
    """Return the CPU time of this process and of its children waited for."""
    now = os.times()
    return now.user + now.system + now.children_user + now.children_system


def sizes(quick: bool) -> int:
    """Return the number of agents to render."""
    return 500 if quick else 10_000


def mosquitto_passwd_seconds(users: int, workdir: Path) -> float:
    """Time Mosquitto's own tool hashing the same number of passwords ($7$) in one run."""
    binary = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    path = workdir / "plain-passwd"
    path.write_text("".join(f"user{i}:{uuid4().hex}\n" for i in range(users)))
    started = time.perf_counter()
    subprocess.run([binary, "-U", str(path)], check=True, capture_output=True)
    return time.perf_counter() - started


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    """Measure figure 7: render (new secrets) and re-render, against mosquitto_passwd -U."""
    agents = sizes(quick)
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = parse_fleet(tree_toml(agents, 10))
    user, port = getpass.getuser(), free_port()
    steps = {}
    # CPU of this process and of the children it waited for (the hashing interpreter)
    # beside the wall time: on a shared loaded machine the wall time says more about the
    # neighbours than about the render.
    cpu = {}
    formats: tuple[tuple[str, str, Format], ...] = (
        ("render_s", "acl", "acl"),
        ("rerender_s", "acl", "acl"),
        ("dynsec_s", "dyn", "dynsec"),
    )
    for label, where, fmt in formats:
        started, cpu_started = time.perf_counter(), cpu_seconds()
        result = render_broker_dir(
            fleet, workdir / where, port=port, fmt=fmt, run_as_user=user, explorer=True
        )
        steps[label] = round(time.perf_counter() - started, 3)
        cpu[label.replace("_s", "_cpu_s")] = round(cpu_seconds() - cpu_started, 3)
    broker = LocalBroker((workdir / "acl" / "mosquitto.conf"), port=port)
    started = time.perf_counter()
    broker.start()
    steps["mosquitto_start_s"] = round(time.perf_counter() - started, 3)
    broker.stop()
    identities = len(fleet) + 5  # the agents, the operator, its 2 looks, explorer, canary
    baseline = mosquitto_passwd_seconds(identities, workdir)
    return figure(
        title=f"Render broker security (acl_file, passwd, credential store) for {agents} agents",
        unit="s",
        vox=steps["render_s"],
        baseline=baseline,
        target="first render of 10,000 agents <= 2 s (baseline: mosquitto_passwd -U, as many)",
        met=None if quick else steps["render_s"] <= 2.0,
        agents=agents,
        identities=identities,
        steps=steps,
        cpu=cpu,
        dynsec_file_bytes=result.dynsec.stat().st_size if result.dynsec else None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--check", action="store_true", help="also start mosquitto on the result")
    args = parser.parse_args()
    text = tree_toml(args.agents, args.fanout)
    fleet = timed(
        f"parse fleet ({args.agents} agents, fanout {args.fanout})", lambda: parse_fleet(text)
    )
    user = getpass.getuser()
    with tempfile.TemporaryDirectory(prefix="vox-render-") as tmp:
        acl_dir, dyn_dir = Path(tmp) / "acl", Path(tmp) / "dynsec"
        port = free_port()
        result = timed(
            "render acl (new secrets)",
            lambda: render_broker_dir(fleet, acl_dir, port=port, run_as_user=user, explorer=True),
        )
        timed(
            "re-render acl (secrets kept)",
            lambda: render_broker_dir(fleet, acl_dir, port=port, run_as_user=user, explorer=True),
        )
        timed(
            "render dynsec (new secrets)",
            lambda: render_broker_dir(
                fleet, dyn_dir, port=port, fmt="dynsec", run_as_user=user, explorer=True
            ),
        )
        assert result.acl is not None
        lines = result.acl.read_text().count("\n")
        store = acl_dir / "credentials" / "secrets.json"
        print(
            f"acl: {lines} lines, {result.acl.stat().st_size / 1e6:.1f} MB; "
            f"credential store {store.stat().st_size / 1e6:.1f} MB"
        )
        if args.check:
            broker = LocalBroker(result.conf, port=port)
            timed("mosquitto start on the acl dir", broker.start)
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
