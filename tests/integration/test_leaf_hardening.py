"""A compromised leaf, publishing only on its own topics, blinds nobody and starves no sibling.

The attacker holds spec_a's real credentials and publishes, as spec_a, on the topics the
broker lets spec_a write: its retained status and its own war-room post (the real spec_a
is not running, so nothing it publishes replaces the attack). The rest of the seed tree
runs on a real, secured broker; the operator's views are the real `vox` verbs and the
exporter a real `vox exporter` process scraped over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import Analyst, start_agents, wait_for
from tests.kits.attackerkit import raw_envelope
from tests.kits.brokerkit import Client, SecureBroker, publish_as_identity
from tests.kits.clikit import capture, configs, secure
from tests.kits.promkit import Exporter, run_exporter, sample
from vox_mqtt.agent.facade import VOXAgent
from vox_mqtt.ledger.witness import WITNESS_BURST, WITNESS_RATE
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, now_iso

__all__ = ["capture", "configs", "secure"]  # the fixtures this module borrows

pytestmark = pytest.mark.slow

RUNNING = ["root", "coordinator", "spec_b"]  # spec_a is the compromised leaf
TITLE = "\x1b]0;owned\x07"  # sets the terminal's window title
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: writes the operator's clipboard
ERASE = "\x1b[1A\x1b[2K"  # cursor up, erase the line


def leaf_status(secure: SecureBroker, **details: Any) -> bytes:
    """Return a believable ACTIVE status of spec_a with these details changed."""
    spec = secure.fleet.agent("spec_a")
    base: dict[str, Any] = {
        "name": "spec_a",
        "status": "ACTIVE",
        "epoch": 1,
        "started_at": now_iso(),
        "heartbeat_interval": 1.0,
        "commands": ["analyze"],
        "metrics": {},
    }
    base.update(details)
    return raw_envelope(MSG_AGENT_STATUS, spec.id, spec.master_id, base)


def publish_as_leaf(secure: SecureBroker, topic: str, payload: bytes, tmp: Path) -> None:
    creds = secure.creds("spec_a")
    publish_as_identity(
        port=secure.dir.port,
        username=creds.username,
        password=creds.password,
        topic=topic,
        payload=payload,
        tmp=tmp,
    )


async def start_siblings(stack: AsyncExitStack, secure: SecureBroker, tmp: Path) -> Any:
    roles = {"spec_b": [Analyst()]}
    agents = await start_agents(stack, secure, tmp, roles, RUNNING, heartbeat_interval=1.0)
    await wait_for(lambda: "analyze" in agents["root"].advertised_commands())
    return agents


def misbehaving_posts(root: VOXAgent, subject: Any) -> list[Any]:
    return [
        i
        for i in root.incidents
        if i.failure.subject == subject and i.failure.error_code == "CHILD_MISBEHAVING"
    ]


def ledger_bytes(state: Path) -> int:
    """Return the size of an agent's ledger with its write-ahead log."""
    return sum(p.stat().st_size for p in state.glob("logs.db*"))


def no_escape(code: int, out: str, err: str) -> None:
    assert code == 0, err
    assert "\x1b" not in out, out
    assert "\x1b" not in err, err
    assert "MarkupError" not in err
    assert "Traceback" not in err


async def test_escapes_and_markup_from_a_leaf_are_text_in_every_view(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    """F13: they were written raw, and `[/]` made status, watch, warroom and inbox exit 1."""
    spec = secure.fleet.agent("spec_a")
    async with AsyncExitStack() as stack:
        agents = await start_siblings(stack, secure, tmp_path)
        root = agents["root"]
        status = leaf_status(
            secure,
            name=f"spec_a{TITLE}[/]",
            status="INACTIVE",
            error_code=f"{CLIPBOARD}[/]",
            version=f"{ERASE}[bold]",
        )
        publish_as_leaf(secure, topics.status(spec.id), status, tmp_path)
        post = raw_envelope(
            MSG_SYSTEM_FAILURE,
            spec.id,
            topics.WARROOM_ID,
            {
                "error_code": "DISK_FULL",
                "severity": "ERROR",
                "description": f"disk {TITLE} full [/] {ERASE}[link=x]",
                "subject": str(spec.id),
            },
        )
        publish_as_leaf(secure, topics.warroom(spec.id, spec.id), post, tmp_path)
        await wait_for(lambda: any(i.topic.source == spec.id for i in root.incidents))
        # A job the example roles forward from an incoming e-mail, carried up to the root.
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "0")
        no_escape(code, out, err)
        job = await root.notify_master(
            "job_found",
            {"title": "[/]", "note_to_human": f"mail says {CLIPBOARD} [/]\nsecond {ERASE}line"},
            message_source=f"mail{TITLE}[/]",
        )
        await wait_for(lambda: job.state.name != "QUEUED", timeout=10)

        code, out, err = await capture("status", "--config", configs["operator"], "--wide")
        no_escape(code, out, err)
        assert "spec_a\\x1b]0;owned\\x07[/]" in out
        assert "\\x1b]52;c;" in out
        code, out, err = await capture("status", "--config", configs["operator"], "--json")
        no_escape(code, out, err)
        code, out, err = await capture("watch", "--config", configs["operator"], "--duration", "1")
        no_escape(code, out, err)
        assert "spec_a\\x1b]0;owned\\x07[/]" in out
        code, out, err = await capture("warroom", "--config", configs["operator"])
        no_escape(code, out, err)
        assert "disk \\x1b]0;owned\\x07 full [/] \\x1b[1A\\x1b[2K[link=x]" in out
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "1")
        no_escape(code, out, err)
        assert "job_found" in out
        assert "mail says \\x1b]52;c;" in out
        assert "(mail\\x1b]0;owned\\x07[/])" in out
        # Whatever the kept inbox file holds, a later view shows it, never fails on it.
        inbox = tmp_path / "cli-state" / "operator" / "inbox.jsonl"
        with inbox.open("a", encoding="utf-8") as handle:
            handle.write('[1, 2]\n"text"\n{"type": "[/]", "details": [1], "emitted_at": 5}\n')
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "0")
        no_escape(code, out, err)
        assert "[/]" in out


async def test_a_huge_number_in_a_leaf_status_is_refused_and_shown_as_such(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    """F14, F22: /metrics answered 500 for the whole fleet and `vox status` exited 1."""
    spec = secure.fleet.agent("spec_a")
    huge = 10**400  # valid JSON
    async with AsyncExitStack() as stack:
        agents = await start_siblings(stack, secure, tmp_path)
        root, coordinator = agents["root"], agents["coordinator"]
        metrics = {
            "cpu_percent": huge,
            "agent": {"v": 1, "gauges": {"ledger_bytes": huge}, "messages_per_s": huge},
        }
        publish_as_leaf(
            secure, topics.status(spec.id), leaf_status(secure, metrics=metrics), tmp_path
        )
        entry = coordinator.fleet_view.get(spec.id)
        assert entry is not None
        await wait_for(lambda: entry.misbehaving() or entry.seen)
        assert entry.misbehaving(), entry
        assert "metrics.cpu_percent" in (entry.rejected or "")
        await wait_for(lambda: misbehaving_posts(root, spec.id), timeout=15)

        code, out, err = await capture("status", "--config", configs["operator"], "--wide")
        assert (code, err) == (0, ""), err
        row = next(line for line in out.splitlines() if line.startswith("spec_a "))
        assert "REJECTED" in row
        assert "metrics.cpu_percent" in row
        assert "a huge integer" in row
        code, out, err = await capture("status", "--config", configs["operator"], "--json")
        assert code == 0, err
        rows = {r["name"] or r["id"]: r for r in json.loads(out)["agents"]}
        rejected = [r for r in rows.values() if r["id"] == str(spec.id)]
        assert len(rejected) == 1
        assert "metrics.cpu_percent" in rejected[0]["rejected"]
        assert rows["spec_b"]["status"] == "ACTIVE"
        assert rows["spec_b"]["rejected"] is None

        cm = run_exporter(configs["operator"], tmp_path / "exporter.log")
        exporter: Exporter = await asyncio.to_thread(cm.__enter__)
        try:

            async def up(name: str) -> float | None:
                return sample(await asyncio.to_thread(exporter.samples), "vox_agent_up", agent=name)

            deadline = time.monotonic() + 20
            while await up("spec_b") != 1.0:
                assert time.monotonic() < deadline, exporter.log()
                await asyncio.sleep(0.2)
            text = await asyncio.to_thread(exporter.text)  # HTTP 200, else urlopen raises
            assert 'vox_agent_up{agent="root"' in text
            assert "Traceback" not in exporter.log()
        finally:
            await asyncio.to_thread(cm.__exit__, None, None, None)


async def test_a_leaf_advertising_256_names_cannot_push_out_its_siblings_command(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    """F12: `a000`..`a255` pushed `analyze` out of the advertisement: NO_ROUTE, no incident."""
    spec = secure.fleet.agent("spec_a")
    async with AsyncExitStack() as stack:
        agents = await start_siblings(stack, secure, tmp_path)
        root, coordinator = agents["root"], agents["coordinator"]
        flood = [f"a{i:03d}" for i in range(256)]
        publish_as_leaf(
            secure, topics.status(spec.id), leaf_status(secure, commands=flood), tmp_path
        )
        entry = coordinator.fleet_view.get(spec.id)
        assert entry is not None
        await wait_for(lambda: entry.misbehaving() or "a000" in root.advertised_commands())
        assert entry.misbehaving(), entry
        assert "more than its share of 128" in (entry.rejected or "")
        assert "analyze" in coordinator.advertised_commands()
        assert "analyze" in root.advertised_commands()
        assert not [c for c in root.advertised_commands() if c.startswith("a0")]
        code, out, err = await capture(
            "send", "--config", configs["operator"], "analyze", "target=t1", "--json"
        )
        assert code == 0, (out, err)
        assert json.loads(out)["result"]["by"] == "spec_b"
        # Held as misbehaving, with one incident from its master.
        await wait_for(lambda: misbehaving_posts(root, spec.id), timeout=15)
        [post] = misbehaving_posts(root, spec.id)
        assert post.topic.source == coordinator.id
        assert "more than its share" in post.failure.description

        # Changing its list faster than the documented rate is held the same way.
        other = secure.fleet.agent("spec_b")
        assert other.id != spec.id
        lists = [leaf_status(secure, epoch=2, commands=[f"c{n}"]) for n in range(80)]
        leaf = Client(secure.creds("spec_a"), client_id=f"spec_a-{secrets.token_hex(3)}")
        try:
            assert await asyncio.to_thread(leaf.connect) == 0
            items = [(topics.status(spec.id), p) for p in lists]
            codes = await asyncio.to_thread(leaf.publish_many, items, retain=True)
        finally:
            await asyncio.to_thread(leaf.close)
        assert set(codes) <= {0x00, 0x10}
        await wait_for(lambda: "faster than" in (entry.rejected or ""))
        assert entry.misbehaving()
        assert "analyze" in root.advertised_commands()


CHUNK = 500  # statuses published at once: well within the broker's queue for the master


async def test_a_flood_of_ledger_heads_grows_the_masters_ledger_by_a_bounded_amount(
    secure: SecureBroker, tmp_path: Path
) -> None:
    """F15: 5,000 statuses with another ledger_head each added 5,000 rows to the master's ledger."""
    spec = secure.fleet.agent("spec_a")
    async with AsyncExitStack() as stack:
        agents = await start_agents(stack, secure, tmp_path, {}, ["coordinator"])
        coordinator = agents["coordinator"]
        before = len(await coordinator.memory.witnessed_heads(spec.id))
        size_before = ledger_bytes(tmp_path / "coordinator")
        flood = [
            leaf_status(secure, ledger_head={"row": n + 1, "hash": secrets.token_hex(32)})
            for n in range(5000)
        ]
        metrics = coordinator.metrics

        async def recorded() -> int:
            return len(await coordinator.memory.witnessed_heads(spec.id)) - before

        async def accounted(sent: int) -> None:
            # Each head that reached the master is recorded or counted skipped.
            deadline = time.monotonic() + 30  # the master's reading of one chunk, loaded
            while await recorded() + metrics.witness_skipped < sent:
                assert time.monotonic() < deadline, (
                    sent,
                    await recorded(),
                    metrics.witness_skipped,
                )
                await asyncio.sleep(0.1)

        # In chunks the broker can queue for the master: mosquitto keeps at most
        # max_queued_messages (1,000 + 4 per agent, broker/render.py) for a client beyond
        # what its socket took, and drops the rest (docs/broker.md). 5,000 at once to a
        # master slowed by a loaded machine had lost 46 that way ("Outgoing messages are
        # being dropped" in the broker's log): heads it never received, neither recorded nor
        # skipped. Each chunk is still far faster than the witness's rate.
        leaf = Client(secure.creds("spec_a"), timeout=60)
        started = time.monotonic()
        try:
            assert await asyncio.to_thread(leaf.connect) == 0
            for at in range(0, len(flood), CHUNK):
                items = [(topics.status(spec.id), p) for p in flood[at : at + CHUNK]]
                # From another thread: the master's event loop keeps reading meanwhile.
                codes = await asyncio.to_thread(leaf.publish_many, items, retain=True)
                assert set(codes) <= {0x00, 0x10}
                await accounted(at + len(items))
        finally:
            await asyncio.to_thread(leaf.close)
        print(f"5000 statuses published in {time.monotonic() - started:.1f}s")
        entry = coordinator.fleet_view.get(spec.id)
        assert entry is not None
        assert entry.ledger_head is not None
        assert entry.ledger_head[0] == 5000  # the last one is in the view
        elapsed = time.monotonic() - started
        rows = await recorded()
        print(f"5000 heads in {elapsed:.1f}s: {rows} recorded, {metrics.witness_skipped} skipped")
        assert rows <= WITNESS_BURST + WITNESS_RATE * elapsed + 1
        assert metrics.witness_skipped >= 5000 - rows
        # The skipped heads are in the heartbeat's counters, for the exporter.
        snapshot = metrics.snapshot()
        assert snapshot is not None
        assert snapshot["counters"]["witness_skipped"] == metrics.witness_skipped
        grown = ledger_bytes(tmp_path / "coordinator") - size_before
        print(f"the master's ledger grew by {grown} bytes")


async def test_war_room_codes_are_bounded_labels_on_metrics(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path
) -> None:
    """F21: a 15 KB error_code stayed in every scrape; now it is one bounded label."""
    spec = secure.fleet.agent("spec_a")
    long_code = "X" * 15_000
    post = raw_envelope(
        MSG_SYSTEM_FAILURE,
        spec.id,
        topics.WARROOM_ID,
        {"error_code": long_code, "severity": "ERROR", "description": "d", "subject": str(spec.id)},
    )
    async with AsyncExitStack() as stack:
        await start_siblings(stack, secure, tmp_path)
        cm = run_exporter(configs["operator"], tmp_path / "exporter.log")
        exporter: Exporter = await asyncio.to_thread(cm.__enter__)
        try:
            publish_as_leaf(secure, topics.warroom(spec.id, spec.id), post, tmp_path)

            async def incidents(code: str) -> float | None:
                samples = await asyncio.to_thread(exporter.samples)
                return sample(samples, "vox_warroom_open_incidents", code=code)

            deadline = time.monotonic() + 20
            while await incidents("INVALID_CODE") != 1.0:
                assert time.monotonic() < deadline, await asyncio.to_thread(exporter.text)
                await asyncio.sleep(0.2)
            text = await asyncio.to_thread(exporter.text)
            assert long_code not in text
            labels = re.findall(r'code="([^"]*)"', text)
            assert labels
            assert max(len(label) for label in labels) <= 64
            # Cleared: the series reads 0 (until it expires, docs/metrics.md).
            publish_as_leaf(secure, topics.warroom(spec.id, spec.id), b"", tmp_path)
            deadline = time.monotonic() + 20
            while await incidents("INVALID_CODE") != 0.0:
                assert time.monotonic() < deadline, await asyncio.to_thread(exporter.text)
                await asyncio.sleep(0.2)
        finally:
            await asyncio.to_thread(cm.__exit__, None, None, None)
