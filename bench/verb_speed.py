"""Figure 20: the operator's verbs through the console, one-shot, and `mosquitto_sub`.

A local fleet (root, coordinator, specialist; daemons and a private Mosquitto, as `vox
demo` runs them) and one `vox console serve` for the operator. Each verb runs N times as
its own process, as a person types it: `vox status`, `vox warroom`, `vox inbox`, `vox
request show ID` of a finished request, and `vox --help`:

- through the running console (the verbs' default);
- the same verb `--one-shot` (VOX_CONSOLE=one-shot), the console stopped first, since a
  one-shot verb that logs in as the operator is refused while a console is the operator;
- `mosquitto_sub -C n -W 10` with an explorer login reading the same retained messages
  (every status for status, inbox and request show; the war room's posts for warroom):
  what a client process costs that connects, reads them, and exits.

The wall time of each run, median and p90, with the ratios console/one-shot and
console/mosquitto_sub, all from one run (docs/operations.md, "The operator's console").

    python -m bench.verb_speed [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bench.common import SEED_SHAPE, fleet_text, percentile, run_alone
from bench.voxside import seed_role_specs
from vox_mqtt.cli.localfleet import DemoLayout, LocalFleet
from vox_mqtt.protocol.topics import STATUS_FILTER, WARROOM_FILTER

# The aim for a verb through a running console, at the median (issue text, item 4).
TARGET_S: Final = 0.3
MOSQUITTO_SUB: Final = "mosquitto_sub"
REPO: Final = Path(__file__).resolve().parent.parent


def sizes(quick: bool) -> int:
    """Return how many times each verb runs in each way."""
    return 3 if quick else 15


def _env(one_shot: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VOX_CONSOLE"}
    env["COLUMNS"] = "160"
    if one_shot:
        env["VOX_CONSOLE"] = "one-shot"
    return env


def _vox(args: Sequence[str]) -> list[str]:
    script = Path(sys.executable).parent / "vox"
    program = [str(script)] if script.is_file() else [sys.executable, "-m", "vox_mqtt.cli"]
    return [*program, *args]


def timed(command: Sequence[str], env: dict[str, str], runs: int) -> list[float]:
    """Run a command `runs` times; return each run's wall seconds. Fail on a non-zero exit."""
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            list(command), env=env, cwd=REPO, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        walls.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-400:]}"
            )
    return walls


def summary(walls: list[float]) -> dict[str, float]:
    """Return the median and p90 in seconds of a verb's runs."""
    return {
        "median_s": round(statistics.median(walls), 3),
        "p90_s": round(percentile(walls, 0.9), 3),
        "n": len(walls),
    }


def _wait_for(what: str, check: Any, timeout: float, fleet: LocalFleet) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if dead := fleet.exited():
            raise RuntimeError(f"while waiting for {what}: daemons stopped: {dead}")
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def _console(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            _vox(["console", "serve", "--config", str(config)]),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=_env(False), cwd=REPO, start_new_session=True,
        )  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _sub(fleet: LocalFleet, topic: str, count: int) -> list[str]:
    assert fleet.broker_dir is not None
    creds = fleet.broker_dir.credentials_for("explorer")
    return [
        MOSQUITTO_SUB, "-h", creds.host, "-p", str(creds.port), "-u", creds.username,
        "-P", creds.password, "-i", f"{creds.username}", "-V", "mqttv5",
        "-t", topic, "-C", str(count), "-W", "10", "-F", "%t",
    ]  # fmt: skip


def measure(workdir: Path, runs: int) -> dict[str, Any]:
    """Start a fleet and a console, time every verb three ways, stop all; return the rows."""
    layout = DemoLayout(workdir / "fleet")
    # The daemons import the bench's roles (bench/voxside.py) from this checkout.
    with LocalFleet(layout, agent_env={"PYTHONPATH": str(REPO)}) as fleet:
        fleet.render(fleet_text(SEED_SHAPE, roles=seed_role_specs()))
        fleet.start_broker()
        assert fleet.fleet is not None
        names = [agent.name for agent in fleet.fleet]
        for name in names:
            fleet.start_agent(name)
        config = layout.config("operator")
        console_log = workdir / "console.log"
        console = _console(config, console_log)
        try:
            state = layout.state("operator")

            def statuses() -> bool:
                done = subprocess.run(
                    _vox(["status", "--config", str(config), "--json"]),
                    env=_env(False), cwd=REPO, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                if done.returncode != 0:
                    return False
                agents = json.loads(done.stdout).get("agents", [])
                return sum(1 for a in agents if a.get("status") == "ACTIVE") >= len(names)

            _wait_for("every agent ACTIVE through the console", statuses, 90, fleet)
            # A lost specialist: the war room holds a post (its master's) for `vox warroom`
            # and for mosquitto_sub to read, as on a day something is wrong.
            lost = names[-1]
            fleet.kill_agent(lost)
            del fleet.processes[lost]

            def posted() -> bool:
                done = subprocess.run(
                    _vox(["warroom", "--config", str(config), "--json"]),
                    env=_env(False), cwd=REPO, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                return done.returncode == 0 and bool(done.stdout.strip())

            _wait_for(f"the war room to say {lost} is lost", posted, 90, fleet)
            sent = subprocess.run(
                _vox(["send", "--config", str(config), "ping", "--json"]),
                env=_env(False), cwd=REPO, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if sent.returncode != 0:
                raise RuntimeError(f"vox send ping: {sent.stderr.strip()}")
            request_id = _request_id(state)
            verbs: dict[str, list[str]] = {
                "status": ["status", "--config", str(config)],
                "warroom": ["warroom", "--config", str(config)],
                "inbox": ["inbox", "--config", str(config)],
                "request show": ["request", "show", request_id, "--config", str(config)],
                "--help": ["--help"],
            }
            through = {verb: timed(_vox(args), _env(False), runs) for verb, args in verbs.items()}
            statuses_kept = len(names)
            subs = {
                "status": _sub(fleet, STATUS_FILTER, statuses_kept),
                "warroom": _sub(fleet, WARROOM_FILTER, 1),  # the one post about the lost one
            }
            sub_times: dict[str, list[float]] = {}
            if shutil.which(MOSQUITTO_SUB) is not None:
                for topic_set, command in subs.items():
                    sub_times[topic_set] = _sub_timed(command, runs)
        finally:
            _stop(console)
        one_shot = {verb: timed(_vox(args), _env(True), runs) for verb, args in verbs.items()}
    rows = {}
    for verb in verbs:
        base = "warroom" if verb == "warroom" else "status"
        row: dict[str, Any] = {
            "console": summary(through[verb]),
            "one_shot": summary(one_shot[verb]),
        }
        if verb != "--help" and base in sub_times:
            row["mosquitto_sub"] = {**summary(sub_times[base]), "topics": base}
        rows[verb] = row
    return rows


def _sub_timed(command: list[str], runs: int) -> list[float]:
    """Time mosquitto_sub reading its -C retained messages; fail unless it read them all."""
    walls = []
    count = int(command[command.index("-C") + 1])
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        walls.append(time.perf_counter() - started)
        read = len(done.stdout.splitlines())
        if done.returncode != 0 or read != count:
            raise RuntimeError(
                f"mosquitto_sub exited {done.returncode} after {read} of {count} messages: "
                f"{done.stderr.strip()}"
            )
    return walls


def _request_id(state: Path) -> str:
    """Return the id of the newest request the operator sent, from its ledger (read-only)."""
    import sqlite3

    with sqlite3.connect(f"file:{state / 'logs.db'}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT message_id FROM logs WHERE message_type = 'command_request' "
            "ORDER BY id DESC LIMIT 1"
        ).fetchone()
    if row is None:
        raise RuntimeError("the operator's ledger holds no command_request")
    return str(row[0])


def rows_of(found: dict[str, Any]) -> list[dict[str, Any]]:
    """Return one figure row per verb: the console's median against the one-shot's."""
    rows = []
    for verb, row in found.items():
        console, one_shot = row["console"], row["one_shot"]
        sub = row.get("mosquitto_sub")
        details: dict[str, Any] = {
            "console_p90_s": console["p90_s"],
            "one_shot_median_s": one_shot["median_s"],
            "one_shot_p90_s": one_shot["p90_s"],
            "n": console["n"],
        }
        if sub is not None:
            details["mosquitto_sub_median_s"] = sub["median_s"]
            details["mosquitto_sub_p90_s"] = sub["p90_s"]
            details["mosquitto_sub_topics"] = sub["topics"]
            details["ratio_to_mosquitto_sub"] = round(console["median_s"] / sub["median_s"], 2)
        vox = console["median_s"]
        rows.append(
            {
                "title": f"`vox {verb}`, console vs one-shot (wall, median)",
                "unit": "s",
                "vox": vox,
                "baseline": one_shot["median_s"],
                "ratio": round(vox / one_shot["median_s"], 2) if one_shot["median_s"] else None,
                "target": f"<= {TARGET_S:g} s through the console",
                "met": vox <= TARGET_S,
                "higher_is_better": False,
                **details,
            }
        )
    return rows


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Figure 20: every verb of item 4 three ways, one run."""
    return rows_of(measure(workdir, sizes(quick)))


if __name__ == "__main__":
    raise SystemExit(run_alone(__doc__ or "", run))
