"""message_source after a restart: the origin's value, never the ledger's digest (docs/ledger.md).

On the ledger (real SQLite, reopened): a command acknowledged but not started, and a sent
message still in the outbox, come back with their origin's message_source, and no file of
the state dir names it in clear. On real daemons: a coordinator killed while its delegated
request waits for a frozen specialist re-sends it after its restart with the origin's
message_source; a `mosquitto_sub` witness on `vox/#` sees no `hmac:` value at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.kits.faultkit import ANALYST, Deployment, Processes, deploy_fleet
from tests.kits.ledgerkit import COORD, ROOT
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.agent.restart import request_from_row
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.fleet.config import load_console_config
from vox_mqtt.ledger.store import VOXAgentMemory
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed
from vox_mqtt.protocol.messages import MSG_COMMAND_REQUEST, VOXMessage, new_message

CLIENT = "client-7@example.com"


def _files(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


async def test_a_pending_command_and_an_outbox_entry_come_back_with_their_origin(
    tmp_path: Path,
) -> None:
    path = tmp_path / "logs.db"

    def order(source: UUID, target: UUID, target_name: str) -> VOXMessage:
        details = {"command": "analyze", "params": {"target": target_name}}
        return new_message(
            MSG_COMMAND_REQUEST,
            source=source,
            target=target,
            details=details,
            message_source=CLIENT,
        )

    request, started, down = (
        order(ROOT, COORD, "db-7"),
        order(ROOT, COORD, "db-8"),
        order(COORD, ROOT, "x"),
    )
    async with VOXAgentMemory(path) as ledger:
        await ledger.record_message(request, "received")
        await ledger.record_message(started, "received")
        await ledger.record_message(started, "started")
        payload = json.dumps(down.model_dump(mode="json")).encode()
        await ledger.record_message(down, "sent", outbox=(topics.inbox(ROOT, COORD), payload))
        digest = ledger.stored_source(CLIENT)
    # The file alone names no one: digests in rows, sealed values while needed.
    assert CLIENT.encode() not in _files(tmp_path)
    async with VOXAgentMemory(path) as ledger:
        (pending,) = await ledger.pending_commands()
        unsent = await ledger.pending_outbox()

    assert pending["details"]["message_source"] == digest
    assert pending["origin_source"] == CLIENT
    resumed = request_from_row(pending)
    assert resumed is not None
    assert resumed.message_source == CLIENT
    # What started is no longer held; what is pending still is.
    with contextlib.closing(sqlite3.connect(path)) as db:
        held = db.execute("SELECT message_id FROM held").fetchall()
    assert held == [(str(request.message_id),)]
    (entry,) = unsent
    assert json.loads(entry[2])["message_source"] == CLIENT
    assert b"hmac:" not in entry[2]


def _witness(dep: Deployment) -> subprocess.Popen[bytes]:
    creds = dep.broker_dir.credentials_for("explorer")
    with (dep.root / "witness.txt").open("wb") as out:
        return subprocess.Popen(
            [
                *("mosquitto_sub", "-h", "127.0.0.1", "-p", str(dep.port), "-V", "5", "-q", "1"),
                *("-u", creds.username, "-P", creds.password or "", "-i", "source-witness"),
                *("-t", "vox/#", "-F", "%t %p"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _requests_to(dep: Deployment, name: str) -> list[dict[str, object]]:
    """Return the command_requests the witness saw on an agent's inbox from its master."""
    topic = topics.inbox(dep.id(name), dep.id("coordinator"))
    found = []
    for line in (dep.root / "witness.txt").read_bytes().splitlines():
        if line.startswith(topic.encode() + b" "):
            message = json.loads(line.split(b" ", 1)[1])
            if message["type"] == MSG_COMMAND_REQUEST:
                found.append(message)
    return found


def _poll(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_delegated_request_resent_after_a_restart_carries_the_origins_source(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker], processes: Processes
) -> None:
    shape = {"root": (None, ()), "coordinator": ("root", ()), "spec_a": ("coordinator", (ANALYST,))}
    dep = deploy_fleet(tmp_path, shape, heartbeat=1.0)
    broker_factory(dep.conf_text(), port=dep.port)
    witness = _witness(dep)
    console = load_console_config(dep.operator_config)
    # The origin: a person's console whose message_source is a client's address.
    config = replace(console.agent_config(dep.operator_config.parent), message_source=CLIENT)
    try:
        with dep.recorder() as rec:
            processes.start(dep)
            rec.status(dep.id("root"), status="ACTIVE", commands=["analyze"], timeout=30)
        # The specialist freezes: the coordinator's request waits in its outbox unacknowledged.
        processes["spec_a"].signal(signal.SIGSTOP)

        async def run() -> dict[str, Any]:
            async with VOXAgent(config) as operator:
                task = asyncio.ensure_future(
                    operator.request("analyze", {"target": "db-7"}, to=dep.id("root"), timeout=90)
                )
                await asyncio.to_thread(_poll, lambda: len(_requests_to(dep, "spec_a")) >= 1)
                processes["coordinator"].signal(signal.SIGKILL)
                processes["coordinator"].start()
                # After its restart it re-sends the request from its outbox.
                await asyncio.to_thread(_poll, lambda: len(_requests_to(dep, "spec_a")) >= 2, 60.0)
                processes["spec_a"].signal(signal.SIGCONT)
                # The interrupted command's answer is the runner's (docs/ledger.md): a result,
                # or HANDLER_ERROR for work a restart cut; either way it comes back.
                try:
                    return dict((await task).details)
                except CommandFailed as exc:
                    return {"error": exc.code}

        result = asyncio.run(run())
    finally:
        with contextlib.suppress(ProcessLookupError, AssertionError):
            processes["spec_a"].signal(signal.SIGCONT)
        witness.terminate()
        witness.wait(10)
    assert result
    sent = _requests_to(dep, "spec_a")
    assert len({m["message_id"] for m in sent}) == 1  # the same request, re-sent
    assert {m["message_source"] for m in sent} == {CLIENT}
    assert b"hmac:" not in (dep.root / "witness.txt").read_bytes()
