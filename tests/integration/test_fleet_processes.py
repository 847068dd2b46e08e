"""Seed 000's flow and crash safety with every agent in its own `vox-agent` process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.kits.brokerkit import SEED_TREE
from tests.kits.fleetproc import FleetProcesses, fleet_text, run_fleet, wait_for_route, wait_until
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.topics import STATUS_FILTER

pytestmark = pytest.mark.slow


async def rows_of(path: Path) -> list[dict[str, Any]]:
    async with VOXAgentMemory(path, read_only=True) as memory:
        return await memory.get_recent(10_000)


def trace_cli(ledger: Path, message_id: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vox_mqtt.cli",
            "ledger",
            str(ledger),
            "trace",
            message_id,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_seed_flow_across_processes_with_a_reconstructable_chain(tmp_path: Path) -> None:
    roles = {
        "specialist_a": ["tests.kits.agentkit:Analyst"],
        "specialist_b": ["tests.kits.agentkit:Analyst"],
    }
    with run_fleet(tmp_path, fleet_text(SEED_TREE, roles=roles)) as procs:

        async def flow() -> Any:
            async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
                await wait_for_route(console, "analyze")
                return await console.send_command("analyze", {"target": "contract.pdf"}, wait=20)

        reply = asyncio.run(flow())
        assert reply.details["result"]["target"] == "contract.pdf"
        assert reply.details["handled_by"] == str(procs.fleet.root.id)
        served_by = reply.details["result"]["by"]
        assert served_by in ("specialist_a", "specialist_b")
    check_ledgers(procs, reply.reply_to, served_by)


def check_ledgers(procs: FleetProcesses, request_id: Any, served_by: str) -> None:
    fleet = procs.fleet
    ids = {a.name: str(a.id) for a in fleet} | {"operator": str(fleet.operator_id)}
    root_chain = trace_cli(procs.ledger("root"), str(request_id))
    # Operator's request in, delegated request out to the coordinator, its result in, ours out.
    pairs = {(r["message_type"], r["source"], r["target"]) for r in root_chain}
    assert ("command_request", ids["operator"], ids["root"]) in pairs
    assert ("command_request", ids["root"], ids["coordinator"]) in pairs
    assert ("command_result", ids["coordinator"], ids["root"]) in pairs
    assert ("command_result", ids["root"], ids["operator"]) in pairs
    root_rows = asyncio.run(rows_of(procs.ledger("root")))
    specialists = {ids["specialist_a"], ids["specialist_b"]}
    assert not ({r["source"] for r in root_rows} | {r["target"] for r in root_rows}) & specialists
    # The coordinator links the root's request to the specialist's work through reply_to.
    coord_rows = asyncio.run(rows_of(procs.ledger("coordinator")))
    downstream = [
        r
        for r in coord_rows
        if r["message_type"] == "command_request"
        and r["action"] == "sent"
        and r["target"] == ids[served_by]
    ]
    assert [r["reply_to"] for r in downstream] == [
        next(
            r["message_id"]
            for r in root_chain
            if r["message_type"] == "command_request" and r["source"] == ids["root"]
        )
    ]
    spec_rows = asyncio.run(rows_of(procs.ledger(served_by)))
    assert {(r["message_type"], r["action"]) for r in spec_rows} >= {
        ("command_request", "received"),
        ("command_result", "sent"),
    }
    for name in procs.agents:
        verify = subprocess.run(
            [sys.executable, "-m", "vox_mqtt.cli", "ledger", str(procs.ledger(name)), "verify"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_killed_specialist_loses_no_acknowledged_command_and_runs_none_twice(
    tmp_path: Path,
) -> None:
    tally = tmp_path / "tally.txt"
    roles = {"specialist_a": ["tests.kits.agentkit:Tally"]}
    settings = {"specialist_a": {"tally_file": str(tally)}}
    count = 24
    text = fleet_text(SEED_TREE, roles=roles, settings=settings)
    with run_fleet(tmp_path / "fleet", text, start=False) as procs:
        specialist = procs.agents["specialist_a"]
        # Two at a time, so that at the kill some commands run and the rest wait, acknowledged.
        config = specialist.config.read_text()
        specialist.config.write_text(config.replace("max_concurrency = 32", "max_concurrency = 2"))
        procs.start_all()
        before_kill: list[str] = []

        async def storm() -> list[Any]:
            async with OperatorConsole(procs.operator_config, observe=[STATUS_FILTER]) as console:
                await wait_for_route(console, "tally")

                async def one(n: int) -> Any:
                    try:
                        return await console.send_command(
                            "tally", {"n": n, "seconds": 0.4}, wait=60
                        )
                    except CommandFailed as exc:
                        return exc

                tasks = [asyncio.ensure_future(one(n)) for n in range(count)]
                # Kill the specialist while commands are running and queued.
                await asyncio.to_thread(
                    wait_until,
                    lambda: tally.exists() and len(tally.read_text().split()) >= 3,
                    30,
                    "tallies",
                )
                specialist.kill()
                before_kill.extend(tally.read_text().split())
                await asyncio.sleep(0.5)
                specialist.start()
                return await asyncio.gather(*tasks)

        outcomes = asyncio.run(storm())
    ran = Counter(int(line) for line in tally.read_text().split())
    assert all(times == 1 for times in ran.values()), f"ran twice: {ran}"
    failures = [o for o in outcomes if isinstance(o, CommandFailed)]
    results = [o for o in outcomes if not isinstance(o, CommandFailed)]
    # Nothing was lost: every command either ran and answered, or was reported
    # interrupted by the restart (and not run again). None timed out.
    assert all(f.code == "HANDLER_ERROR" and "restarted" in f.error for f in failures), failures
    assert {r.details["result"] for r in results} <= set(ran)
    assert len(results) + len(failures) == count
    # Commands acknowledged before the kill but not yet started ran after the restart.
    assert len(ran) > len(before_kill)
    assert len(failures) <= 2  # at most the two that were running when it died
