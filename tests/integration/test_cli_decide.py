"""`vox inbox` numbers the jobs and `vox decide N` decides one, on the freelance fleet's broker.

Every refusal is one line and exit 2, whether the console refuses it from what it keeps or the
fleet does (the coordinator, relayed by the root).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from tests.kits.agentkit import wait_for
from tests.kits.clikit import capture
from tests.kits.fleetproc import REPO, child_env, serving_vox
from tests.kits.freelancekit import (
    Fixture,
    drop,
    fleet_fixture,
    future_mail,
    job_mail,
    seed_fleet,
)
from tests.kits.lifecyclekit import ledger_rows
from vox_mqtt.fleet.bundles import render_agent_config

__all__ = ["capture", "fleet_fixture", "seed_fleet"]  # the fixtures this module borrows


def console_env() -> dict[str, str]:
    """A verb's environment: through the console (the suite's one-shot default dropped)."""
    env = child_env()
    env.pop("VOX_CONSOLE", None)
    return env


async def test_vox_inbox_numbers_jobs_and_vox_decide_decides_them(
    fleet_fixture: Fixture, capture: Any, tmp_path: Path
) -> None:
    f = fleet_fixture
    operator = render_agent_config(
        f.secure.fleet,
        "operator",
        f.secure.dir.root,
        tmp_path / "etc" / "operator.toml",
        tmp_path / "operator-cli",
    ).config
    op = ("--config", operator)
    async with AsyncExitStack() as stack:
        await f.start(stack, console=False)
        # The operator's persistent session first, as once set up: the broker then queues
        # the root's notifications in the order they were sent (before it, none is kept and
        # the root's re-sends come in any order).
        code, _, err = await capture("inbox", *op, "--wait", "0")
        assert code == 0, err
        drop(f.intake, "1-a.eml", future_mail(9, 13, 180, 10))
        await wait_for(lambda: len(f.received_jobs("root")) == 1, timeout=30)  # so it is job #1
        # A job whose window ended long ago is notified, and cannot be decided.
        past = "2026-01-12T09:00:00+00:00", "2026-01-12T17:00:00+00:00"
        drop(f.intake, "2-past.eml", job_mail(*past, effort=60, price="20 USD"))
        await wait_for(lambda: len(f.received_jobs("root")) == 2, timeout=30)
        jobs: list[dict[str, Any]] = []
        for _ in range(20):  # each run collects what the broker queued for the operator
            code, out, _ = await capture("inbox", *op, "--wait", "0.5", "--json", "--keep-unread")
            jobs = [e for e in json.loads(out) if "job" in e]
            if len(jobs) == 2:
                break
        assert [j["job"] for j in jobs] == [1, 2]
        code, out, err = await capture("inbox", *op, "--wait", "0")
        assert code == 0, err
        assert "job_detected #1 from root" in out
        assert "undecided; overlaps no undecided job: `vox decide 1 approve|reject`" in out
        assert "2 job(s) undecided" in out

        code, out, err = await capture("decide", *op, "1", "approve", "--note", "yes please")
        assert code == 0, err
        assert out.startswith("job #1 approved: booked: 180 min of work")
        refusals = {}
        for args in (("1", "reject"), ("3", "approve"), ("2", "approve")):
            refusals[args[0]] = await capture("decide", *op, *args)
        # The fleet refuses too when the console's own record does not stop it.
        (tmp_path / "operator-cli" / "decisions.jsonl").unlink()
        fleet_refusal = await capture("decide", *op, "1", "reject")
        code, out, err = await capture("inbox", *op, "--wait", "0", "--undecided")
        # The root's trace of job #1 shows the decision, its verdict and the outcome.
        root_db = f.tmp / "root" / "logs.db"
        traced = await capture("ledger", root_db, "trace", jobs[0]["message_id"][:8])
        # Through the operator's console, a decision leaves a door row in its ledger (every
        # door is audited: console/doorlog.py), refused by the fleet as it is here.
        serve = ["console", "serve", "--config", str(operator)]
        log = tmp_path / "console.log"
        with serving_vox(
            serve, log, lambda text: "up" if "listening on" in text else None, "the console"
        ):
            via = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "vox_mqtt.cli", "decide", *op, "1", "reject"],
                capture_output=True, text=True, env=console_env(), cwd=REPO, timeout=60,
            )  # fmt: skip
    assert via.returncode == 2, (via.stdout, via.stderr)
    assert "ALREADY_DECIDED" in via.stderr, via.stderr
    rows = ledger_rows(tmp_path / "operator-cli" / "logs.db")
    doors = [json.loads(r["details"]) for r in rows if r["event_type"] == "door"]
    assert [(d["door"], d["what"], d["request_id"], d["verdict"]) for d in doors] == [
        ("cli", "decision", jobs[0]["message_id"], "reject")
    ], doors
    assert refusals["1"][:2] == (2, "")
    assert "vox: error: decide #1 reject: job #1 was already approved" in refusals["1"][2]
    assert refusals["3"][0] == 2
    assert "no job #3: the inbox holds 2 job(s), #1 to #2" in refusals["3"][2]
    assert refusals["2"][0] == 2
    assert "job #2 expired: its window ended at 2026-01-12T17:00:00+00:00" in refusals["2"][2]
    assert fleet_refusal[0] == 2
    assert "vox: error: decide #1 reject: ALREADY_DECIDED: job " in fleet_refusal[2]
    for _, _, message in (*refusals.values(), fleet_refusal):
        # One line each (a loaded machine may add the runtime's own log lines to stderr).
        assert len([line for line in message.splitlines() if "error" in line]) == 1, message
    # With its record gone the console shows job #1 undecided again; the coordinator knows.
    assert "job_detected #1" in out
    assert "job_detected #2" in out
    assert traced[0] == 0, traced
    assert "decision " in traced[1]
    assert "verdict=approve" in traced[1]
    assert "outcome=booked: 180 min of work" in traced[1]
    book = f.agents["coordinator"].roles[0].book
    assert [job.decision for job in book.jobs()] == ["approve", None]
