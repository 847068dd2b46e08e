"""Time `render_broker_dir` on a generated fleet (default 10,000 agents), both formats.

    .venv/bin/python bench/render_large.py [--agents N] [--fanout K] [--check]

Prints the time of each step: parsing the fleet file, the first render (every
secret new, every `$7$` hash computed), a re-render (secrets kept, each hash
verified instead), the dynsec render, and with --check, how long Mosquitto
itself takes to start on the result.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import tempfile
import time
from pathlib import Path
from uuid import uuid4

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vox_mqtt.brokerconf import render_broker_dir
from vox_mqtt.hierarchy import parse_fleet
from vox_mqtt.localbroker import LocalBroker, free_port


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
        print(
            f"acl: {lines} lines, {result.acl.stat().st_size / 1e6:.1f} MB; "
            f"{len(fleet) + 2} credentials files"
        )
        if args.check:
            broker = LocalBroker(result.conf, port=port)
            timed("mosquitto start on the acl dir", broker.start)
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
