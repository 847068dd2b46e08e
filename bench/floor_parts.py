"""The obligations floor, part by part: how much of VOX's gap the envelope and the ledger cost.

Figures 1 and 3 judge VOX against the obligations floor (bench/rawmqtt.py): bare MQTT
clients that acknowledge, answer and commit exactly as a VOX hop must, into a minimal SQLite
table (docs/performance.md, "The price of the guarantees alone"). The floor leaves out two
guarantees VOX keeps by contract. This module adds them to the floor one at a time and
measures every step beside VOX itself, in one run against one broker:

1. ``floor``: the obligations floor as figures 1 and 3 measure it, unchanged (RawNode with a
   rawmqtt.Journal for one hop, a GroupJournal for throughput), on the raw client that was
   the faster one in this run (as bench/one_hop.py and bench/throughput.py choose it).
2. ``floor+envelope``: the same nodes, rows and commits, but every payload is a VOX envelope
   (docs/messages.md): requests are ``command_request``, answers ``command_result`` and acks
   ``message_acknowledged`` messages built with ``new_message`` / ``VOXMessage.reply`` /
   ``acknowledgement`` and encoded with ``serialize``; every payload received is decoded and
   validated with ``parse`` (the envelope and its payload model, pydantic). A relay sends a
   new request of its own downstream and a new answer of its own upstream (an envelope names
   its source and target), so it keeps which downstream request stands for which upstream
   one, as VOX does. What it adds: the envelope's construction, serialization and
   validation, nothing else.
3. ``floor+envelope+ledger``: as 2, but each node commits the same steps, in the same
   groups, into a real VOX ledger (``VOXAgentMemory``, docs/ledger.md) opened as an agent
   opens it (``commit_window=0``, the run's ``ledger_sync``, "full" unless
   ``VOX_BENCH_LEDGER_SYNC`` says otherwise), through its public calls: ``record_message``
   with ``then=`` rows for a group ("Rows that commit together"), ``record_received_later``
   for an ack's row (nothing waits for it), the outbox (a request's ``sent`` row keeps it,
   its answer's ``received`` row removes it: ``outbox=``, ``outbox_done=``), the answer held
   for replay (``replay_until=``), and the in-memory dedupe check (``has_message`` with
   ``emitted_at``) before a request is acted on. The floor's table keeps each sent payload
   in its row; the ledger keeps it in the outbox or the replay table instead, as VOX does.
   What it adds: the schema and its indexes and triggers, the hash chain, the metadata rows,
   the keyed digest and sealing of ``message_source``, the writer thread's hand-off.
4. ``vox``: VOX itself, all-in-one (every agent in this process), measured by the same
   functions as figures 1 and 3 (bench/one_hop.vox_round_trips,
   bench/throughput.vox_rate).

Two shapes, each variant measured the same way:

- throughput (figure 3): commands/s through root -> coordinator -> two specialists with 32
  commands in flight (8 with --quick), and the CPU of this process per command
  (throughput.CpuMeter; every node and the load generator run in this process);
- one hop (figure 1): sequential operator -> root round trips, p50 (and the CPU per round
  trip of this process, every thread's).

Beside figure 3's CPU per command, the floor variants built here also report it split into
user and system time and the part of threads other than the loop's (the ledger's writer
threads), and their commits per command. The three floor variants take turns in three
rounds (one with --quick), so a load that comes and goes falls on each alike; VOX runs
once, after them, as in figures 1 and 3. Single runs on a shared 2-core VM vary a lot
(docs/performance.md): the per-round numbers are in the JSON.

What remains between ``floor+envelope+ledger`` and ``vox`` is what VOX does beyond these two
guarantees: routing and least-busy delegation, request tracking and re-sending, deadlines,
metrics, status, the inbound pipeline's checks and its roles, in Python.

    python -m bench.floor_parts [--quick] [--json PATH] [--profile VARIANT]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import psutil

from bench import one_hop, throughput
from bench.common import SEED_SHAPE, BenchBroker, bench_broker, fleet_text, latency_summary
from bench.profiling import summarize
from bench.rawmqtt import RAW_CLIENTS, GroupJournal, Journal, RawNode
from bench.throughput import TREE, CpuMeter, drive
from bench.voxside import LEDGER_SYNC_ENV, seed_role_specs
from vox_mqtt.ledger.actions import LedgerAction
from vox_mqtt.ledger.store import LedgerSync, VOXAgentMemory
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_REQUEST,
    MSG_COMMAND_RESULT,
    VOXMessage,
    new_message,
    parse,
    serialize,
)

FLOOR = "floor"
ENVELOPE = "floor+envelope"
LEDGER = "floor+envelope+ledger"
VOX = "vox"
VARIANTS = (FLOOR, ENVELOPE, LEDGER, VOX)
PARAMS = {"text": "hello"}
# How long an answer is held for replay: a request without a deadline is re-sent for the
# agents' default request_timeout, and the answer is held that long and a margin more.
REPLAY_SECONDS = 30.0 + 60.0

# A row as a node stages it: the message, what happened to it, and the bytes the floor's
# table keeps in its row (the payload received or sent; nothing for a state row).
Row = tuple[VOXMessage, LedgerAction, bytes]


@dataclass(frozen=True)
class Kept:
    """A message a VOX ledger keeps whole: in the outbox, or held for replay (an answer)."""

    topic: str
    payload: bytes
    message: VOXMessage
    replay: bool = False


class Steps(Protocol):
    """Where a node's steps become durable: the floor's table or a VOX ledger."""

    async def commit(
        self,
        rows: Sequence[Row],
        *,
        topic: str | None = None,
        kept: Kept | None = None,
        done: UUID | None = None,
    ) -> None:
        """Return once the rows are committed together (kept: a message kept whole;
        done: a sent message that leaves the outbox in this commit)."""

    def later(self, row: Row, *, topic: str) -> None:
        """Record an ack's received row with the next commit: nothing waits for it."""

    async def seen(self, message: VOXMessage) -> bool:
        """Tell whether a request was already received (the dedupe check)."""

    async def close(self) -> None:
        """Write what is queued and close."""

    @property
    def commits(self) -> int:
        """Return how many transactions were committed."""


class CountingJournal(Journal):
    """rawmqtt.Journal, counting its transactions."""

    commits = 0

    def commit(self, *rows: tuple[str, str, bytes]) -> None:
        self.commits += 1
        super().commit(*rows)


class CountingGroupJournal(GroupJournal):
    """rawmqtt.GroupJournal, counting its transactions."""

    commits = 0

    def commit(self, *rows: tuple[str, str, bytes]) -> None:
        self.commits += 1
        super().commit(*rows)


class JournalSteps:
    """The floor's own table (rawmqtt.Journal or GroupJournal): one row per step, its bytes."""

    def __init__(self, journal: CountingJournal | CountingGroupJournal) -> None:
        self.journal = journal

    @property
    def commits(self) -> int:
        """Return how many transactions were committed."""
        return self.journal.commits

    @staticmethod
    def _row(row: Row) -> tuple[str, str, bytes]:
        message, action, body = row
        return str(message.message_id), str(action), body

    async def commit(
        self,
        rows: Sequence[Row],
        *,
        topic: str | None = None,
        kept: Kept | None = None,
        done: UUID | None = None,
    ) -> None:
        # The sent payload is already in its row's body; the floor never empties an outbox.
        await self.journal.durable(*map(self._row, rows))

    def later(self, row: Row, *, topic: str) -> None:
        self.journal.later(self._row(row))

    async def seen(self, message: VOXMessage) -> bool:
        return False  # the floor makes no dedupe check

    async def close(self) -> None:
        self.journal.close()


class LedgerSteps:
    """A real VOX ledger, written through its public calls as an agent writes it."""

    def __init__(self, path: Path, sync: LedgerSync) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # As agent/facade.py opens an agent's ledger: no commit window.
        self.memory = VOXAgentMemory(path, commit_window=0, sync=sync)
        self._later: set[asyncio.Future[int]] = set()

    async def open(self) -> None:
        await self.memory.init_db()

    @property
    def commits(self) -> int:
        """Return how many transactions were committed."""
        return self.memory.commit_count

    async def commit(
        self,
        rows: Sequence[Row],
        *,
        topic: str | None = None,
        kept: Kept | None = None,
        done: UUID | None = None,
    ) -> None:
        (first, action, _), *rest = rows
        outbox = None if kept is None else (kept.topic, kept.payload)
        await self.memory.record_message(
            first,
            action,
            topic=topic,
            then=[(message, what, None) for message, what, _ in rest],
            outbox=outbox,
            outbox_for=None if kept is None or kept.message is first else kept.message,
            outbox_done=done,
            replay_until=time.time() + REPLAY_SECONDS if kept and kept.replay else None,
        )

    def later(self, row: Row, *, topic: str) -> None:
        # A command_request stays in the outbox until answered: its ack removes nothing.
        future = self.memory.record_received_later(row[0], topic=topic, outbox_done=None)
        self._later.add(future)
        future.add_done_callback(self._later.discard)

    async def seen(self, message: VOXMessage) -> bool:
        return await self.memory.has_message(message.message_id, emitted_at=message.emitted_at)

    async def close(self) -> None:
        await self.memory.close()


class EnvelopeNode(RawNode):
    """A RawNode whose every payload is a VOX envelope, its steps committed through `steps`.

    The same obligations as RawNode with a journal (bench/rawmqtt.py): a relay records the
    request, its ack, the delegation and the downstream request in one commit, then
    acknowledges and passes it on; on the way up it records the child's answer, its own
    answer and the end in one commit, then passes the answer on; a specialist answers at
    once (the answer standing for the ack), in one commit; the requester sees its answer
    before that answer's own commit. Acks are never awaited; their rows join the next commit.
    """

    def __init__(
        self,
        bench: BenchBroker,
        name: str,
        steps: Steps,
        *,
        master: str | None = None,
        children: tuple[str, ...] = (),
        client: str = "aiomqtt",
    ) -> None:
        super().__init__(bench, name, master=master, children=children, client=client)
        self.steps = steps
        self._answers: dict[UUID, asyncio.Future[VOXMessage]] = {}
        self._upstream: dict[UUID, VOXMessage] = {}  # downstream request id -> upstream one

    async def __aexit__(self, *exc_info: object) -> None:
        await super().__aexit__(*exc_info)
        await self.steps.close()

    async def command(self, to: UUID, command: str, params: dict[str, Any]) -> VOXMessage:
        """Send a command_request to a child and return the command_result that answers it."""
        request = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=to,
            details={"command": command, "params": params},
        )
        payload, topic = serialize(request), topics.inbox(to, self.id)
        waiter: asyncio.Future[VOXMessage] = asyncio.get_running_loop().create_future()
        self._answers[request.message_id] = waiter
        try:
            # Kept whole until answered (the outbox): a restart re-sends it.
            kept = Kept(topic, payload, request)
            await self.steps.commit([(request, LedgerAction.SENT, payload)], kept=kept)
            await self.client.publish(topic, payload, qos=1)
            return await waiter
        finally:
            self._answers.pop(request.message_id, None)

    async def _publish(self, message: VOXMessage, payload: bytes) -> None:
        await self.client.publish(topics.inbox(message.target, self.id), payload, qos=1)

    async def _handle(self, payload: Any) -> None:
        raw = bytes(payload)
        message = parse(raw)  # the envelope and its payload model, validated
        self.handled += 1
        topic = topics.inbox(self.id, message.source)
        if message.type == MSG_ACKNOWLEDGED:
            self.steps.later((message, LedgerAction.RECEIVED, raw), topic=topic)
        elif message.type == MSG_COMMAND_RESULT:
            await self._answered(message, raw, topic)
        elif message.type == MSG_COMMAND_REQUEST:
            if await self.steps.seen(message):
                return  # a re-sent copy: never the case here, but the check is paid
            if self._next_child is not None:
                await self._delegate(message, raw, topic)
            else:
                await self._serve(message, raw, topic)
        else:
            raise ValueError(f"{self.id}: unexpected {message.type}")

    async def _answered(self, answer: VOXMessage, raw: bytes, topic: str) -> None:
        """An answer came up: settle the caller, or pass it up as this relay's own answer."""
        assert answer.reply_to is not None
        received: Row = (answer, LedgerAction.RECEIVED, raw)
        waiter = self._answers.get(answer.reply_to)
        if waiter is not None:
            # The caller sees the answer before its record commits, as VOX's does.
            if not waiter.done():
                waiter.set_result(answer)
            await self.steps.commit([received], topic=topic, done=answer.reply_to)
            return
        request = self._upstream.pop(answer.reply_to)
        details = answer.details
        up = request.reply(
            MSG_COMMAND_RESULT,
            {"command": details.get("command"), "result": details.get("result"),
             "handled_by": str(self.id)},
        )  # fmt: skip
        payload = serialize(up)
        await self.steps.commit(
            [received, (up, LedgerAction.SENT, payload), (request, LedgerAction.COMPLETED, b"")],
            topic=topic,
            kept=Kept(topics.inbox(up.target, self.id), payload, up, replay=True),
            done=answer.reply_to,
        )
        await self._publish(up, payload)

    async def _delegate(self, request: VOXMessage, raw: bytes, topic: str) -> None:
        """Record, acknowledge and pass a request down to the next child, as a relay must."""
        assert self._next_child is not None
        ack = request.acknowledgement()
        ack_payload = serialize(ack)
        down = new_message(
            MSG_COMMAND_REQUEST,
            source=self.id,
            target=next(self._next_child),
            details=request.details,
            message_source=request.message_source,
        )
        down_payload = serialize(down)
        self._upstream[down.message_id] = request
        await self.steps.commit(
            [
                (request, LedgerAction.RECEIVED, raw),
                (ack, LedgerAction.SENT, ack_payload),
                (request, LedgerAction.DELEGATED, b""),
                (down, LedgerAction.SENT, down_payload),
            ],
            topic=topic,
            kept=Kept(topics.inbox(down.target, self.id), down_payload, down),
        )
        await self._publish(ack, ack_payload)
        await self._publish(down, down_payload)

    async def _serve(self, request: VOXMessage, raw: bytes, topic: str) -> None:
        """Answer at once: the quick answer to an idempotent command stands for its ack."""
        details = request.details
        answer = request.reply(
            MSG_COMMAND_RESULT,
            {"command": details["command"], "result": details.get("params"),
             "handled_by": str(self.id)},
        )  # fmt: skip
        payload = serialize(answer)
        await self.steps.commit(
            [
                (request, LedgerAction.RECEIVED, raw),
                (request, LedgerAction.STARTED, b""),
                (answer, LedgerAction.SENT, payload),
                (request, LedgerAction.COMPLETED, b""),
            ],
            topic=topic,
            kept=Kept(topics.inbox(answer.target, self.id), payload, answer, replay=True),
        )
        await self._publish(answer, payload)


def ledger_sync() -> LedgerSync:
    """Return the run's ledger_sync, as bench/voxside.py gives it to the VOX agents."""
    sync = os.environ.get(LEDGER_SYNC_ENV, "full")
    if sync not in ("full", "normal"):
        raise SystemExit(f"{LEDGER_SYNC_ENV}={sync!r}: full or normal")
    return "full" if sync == "full" else "normal"


async def start_nodes(
    stack: AsyncExitStack,
    bench: BenchBroker,
    variant: str,
    tree: dict[str, tuple[str | None, tuple[str, ...]]],
    *,
    shape: str,
    client: str,
) -> dict[str, RawNode]:
    """Start the tree's nodes of a floor variant (ENVELOPE, LEDGER) and return them by name.

    shape: "throughput" (steps of one loop turn commit together, as GroupJournal does) or
    "one_hop" (a commit per step, as Journal does); a ledger groups by itself either way.
    """
    nodes: dict[str, RawNode] = {}
    for name, (master, children) in tree.items():
        steps: Steps
        if variant == LEDGER:
            where = bench.workdir / "parts" / f"{shape}-{name}" / "logs.db"
            steps = LedgerSteps(where, ledger_sync())
            await steps.open()
        else:
            path = bench.workdir / f"parts-{shape}-{name}.db"
            journal = CountingGroupJournal(path) if shape == "throughput" else CountingJournal(path)
            steps = JournalSteps(journal)
        node = EnvelopeNode(bench, name, steps, master=master, children=children, client=client)
        nodes[name] = await stack.enter_async_context(node)
    return nodes


def cpu_split() -> tuple[float, float, float]:
    """Return this process's (user, system, threads other than this one's) CPU seconds."""
    me = psutil.Process()
    times = me.cpu_times()
    main = threading.get_native_id()
    others = sum(t.user_time + t.system_time for t in me.threads() if t.id != main)
    return times.user, times.system, others


async def metered(
    bench: BenchBroker,
    call: Callable[[], Awaitable[Any]],
    concurrency: int,
    seconds: float,
    commits: Callable[[], int] | None = None,
) -> dict[str, Any]:
    """Drive the calls after a warm-up; return the rate and this process's CPU per command.

    Besides figure 3's two CPU figures: this process's CPU split into user and system time
    and the share of threads other than the event loop's (a ledger's writer threads), and,
    given a count of transactions, the commits per command.
    """
    await drive(call, concurrency, min(seconds, 1.0))  # warm-up, as figure 3's
    meter = CpuMeter(bench.broker_pid)
    split = cpu_split()
    committed = commits() if commits else 0
    meter.start()
    rate = await drive(call, concurrency, seconds)
    mine, broker, _ = meter.stop()
    user, system, others = (b - a for a, b in zip(split, cpu_split(), strict=True))
    count = rate * seconds
    result = {
        "commands_per_second": round(rate, 1),
        "cpu_ms_per_command_python": round(1000 * mine / count, 3),
        "cpu_ms_per_command_broker": round(1000 * broker / count, 3),
        "cpu_ms_per_command_user": round(1000 * user / count, 3),
        "cpu_ms_per_command_system": round(1000 * system / count, 3),
        "cpu_ms_per_command_other_threads": round(1000 * others / count, 3),
    }
    if commits is not None:
        result["commits_per_command"] = round((commits() - committed) / count, 2)
    return result


async def parts_rate(
    bench: BenchBroker,
    variant: str,
    concurrency: int,
    seconds: float,
    *,
    client: str,
    profile_seconds: float = 0.0,
) -> dict[str, Any]:
    """Measure figure 3's rate for ENVELOPE or LEDGER (and profile it, if asked)."""
    async with AsyncExitStack() as stack:
        nodes = await start_nodes(stack, bench, variant, TREE, shape="throughput", client=client)
        operator, root = nodes["operator"], bench.id("root")
        assert isinstance(operator, EnvelopeNode)

        async def call() -> None:
            await operator.command(root, "echo", PARAMS)

        def commits() -> int:
            return sum(n.steps.commits for n in nodes.values() if isinstance(n, EnvelopeNode))

        result = await metered(bench, call, concurrency, seconds, commits)
        if profile_seconds:
            result["profile"] = await profiled(call, concurrency, profile_seconds)
    return result


async def profiled(
    call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float
) -> dict[str, Any]:
    """Run the calls under cProfile; return where the time went (bench/profiling.py)."""
    profiler = cProfile.Profile()
    profiler.enable()
    rate = await drive(call, concurrency, seconds)
    profiler.disable()
    profile = summarize(profiler, top=12)
    profile["commands_per_second_under_profiler"] = round(rate, 1)
    profile["loop_turns_per_command"] = round(profile["loop_turns"] / max(1.0, rate * seconds), 1)
    return profile


async def parts_round_trips(
    bench: BenchBroker, variant: str, count: int, warmup: int, *, client: str
) -> tuple[list[float], float]:
    """Time sequential operator -> root round trips of ENVELOPE or LEDGER; also CPU ms each."""
    tree: dict[str, tuple[str | None, tuple[str, ...]]] = {
        "operator": (None, ("root",)),
        "root": ("operator", ()),
    }
    async with AsyncExitStack() as stack:
        nodes = await start_nodes(stack, bench, variant, tree, shape="one_hop", client=client)
        operator, root = nodes["operator"], bench.id("root")
        assert isinstance(operator, EnvelopeNode)
        for _ in range(warmup):
            await operator.command(root, "ping", PARAMS)
        return await timed(lambda: operator.command(root, "ping", PARAMS), count)


async def timed(call: Callable[[], Awaitable[Any]], count: int) -> tuple[list[float], float]:
    """Time `count` sequential calls (ms each); return them and this process's CPU ms per call."""
    cpu = time.process_time()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times, 1000 * (time.process_time() - cpu) / count


async def with_cpu(
    trips: Callable[[int], Awaitable[list[float]]], count: int
) -> tuple[list[float], float]:
    """Time `count` round trips with a figure's own function; also their CPU ms each.

    The function starts its nodes and warms up before it times: it is run again for one
    round trip, and the CPU of this process between the two runs, over count - 1 trips, is
    the CPU of a round trip (every thread's, the ledgers' writers included).
    """
    cpu = time.process_time()
    times = await trips(count)
    full = time.process_time() - cpu
    cpu = time.process_time()
    await trips(1)
    alone = time.process_time() - cpu
    return times, 1000 * max(0.0, full - alone) / max(1, count - 1)


def sizes(quick: bool) -> tuple[int, float, float, int, int, int]:
    """Return (concurrency, seconds per side, seconds profiled, round trips, warm-up trips,
    rounds of the floor variants)."""
    concurrency, seconds, profile_seconds = throughput.sizes(quick)
    count, warmup = one_hop.sizes(quick)
    return concurrency, seconds, profile_seconds, count, warmup, 1 if quick else 3


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Return throughput rounds of equal length as one: rates averaged, CPU per command
    weighted by each round's commands, and each round's rate."""
    total = sum(r["commands_per_second"] for r in rounds)
    out: dict[str, Any] = {"commands_per_second": round(total / len(rounds), 1)}
    for key in rounds[0]:
        if key != "commands_per_second" and isinstance(rounds[0][key], int | float):
            weighted = sum(r[key] * r["commands_per_second"] for r in rounds)
            out[key] = round(weighted / total, 3)
    out["rounds"] = [r["commands_per_second"] for r in rounds]
    return out


async def measure(workdir: Path, quick: bool, profile: str | None) -> dict[str, Any]:
    """Measure every variant in both shapes on one broker: the floors first, VOX last.

    The three floor variants take turns, in rounds (three in a full run, each a third of
    the round trips and of the seconds), so a load that comes and goes on the machine falls
    on each of them alike; VOX comes after them all, once, as in figures 1 and 3: an
    agent's session persists at the broker, and would queue the floors' traffic to its
    inbox if a floor ran after it.
    """
    concurrency, seconds, profile_seconds, count, warmup, rounds = sizes(quick)
    floors = (FLOOR, ENVELOPE, LEDGER)
    rate_rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in floors}
    hop_times: dict[str, list[float]] = {v: [] for v in floors}
    hop_cpu: dict[str, list[float]] = {v: [] for v in floors}
    rates: dict[str, dict[str, Any]] = {}
    hops: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with bench_broker(workdir, fleet_text(SEED_SHAPE, roles=seed_role_specs())) as bench:
        # The raw clients without obligations, only to pick the faster one as the figures do.
        raw_rates = {
            name: await throughput.raw_rate(bench, concurrency, seconds, client=name)
            for name in RAW_CLIENTS
        }
        rate_client = max(raw_rates, key=lambda n: raw_rates[n]["commands_per_second"])
        raw_hops = {
            name: latency_summary(
                await one_hop.raw_round_trips(
                    bench, ["operator", "root"], count, warmup, client=name
                )
            )
            for name in RAW_CLIENTS
        }
        hop_client = min(raw_hops, key=lambda n: raw_hops[n]["p50_ms"])
        part_count, part_seconds = count // rounds, seconds / rounds
        for turn in range(rounds):
            # Each variant first, in the middle and last once in three rounds.
            for variant in floors[turn % 3 :] + floors[: turn % 3]:
                # One hop (sequential, quick), then throughput.
                if variant == FLOOR:
                    times, cpu = await with_cpu(
                        lambda n: one_hop.raw_round_trips(
                            bench, ["operator", "root"], n, warmup, durable=True,
                            client=hop_client,
                        ),
                        part_count,
                    )  # fmt: skip
                    rate = await throughput.raw_rate(
                        bench, concurrency, part_seconds, durable=True, client=rate_client
                    )
                else:
                    times, cpu = await parts_round_trips(
                        bench, variant, part_count, warmup, client=hop_client
                    )
                    rate = await parts_rate(
                        bench, variant, concurrency, part_seconds, client=rate_client
                    )
                hop_times[variant] += times
                hop_cpu[variant].append(cpu)
                rate_rounds[variant].append(rate)
        for variant in floors:
            rates[variant] = pooled(rate_rounds[variant])
            hops[variant] = {
                **latency_summary(hop_times[variant]),
                "cpu_ms_per_round_trip_python": round(statistics.fmean(hop_cpu[variant]), 3),
                "p50_ms_rounds": [
                    round(statistics.median(hop_times[variant][i : i + part_count]), 3)
                    for i in range(0, len(hop_times[variant]), part_count)
                ],
            }
        if profile == FLOOR:
            rates[FLOOR]["profile"] = await floor_profile(
                bench, concurrency, profile_seconds, client=rate_client
            )
        elif profile in (ENVELOPE, LEDGER):
            rates[profile]["profile"] = (
                await parts_rate(
                    bench, profile, concurrency, 1.0, client=rate_client,
                    profile_seconds=profile_seconds,
                )
            )["profile"]  # fmt: skip
        # VOX last, so no VOX session ever queues the floors' traffic (as the figures order it).
        times, cpu = await with_cpu(
            lambda n: one_hop.vox_round_trips(bench, ["root"], "ping", n, warmup), count
        )
        hops[VOX] = {**latency_summary(times), "cpu_ms_per_round_trip_python": round(cpu, 3)}
        vox, vox_profile = await throughput.vox_rate(
            bench, concurrency, seconds, profile_seconds if profile == VOX else 0.1
        )
        rates[VOX] = vox
        if profile == VOX:
            rates[VOX]["profile"] = vox_profile
    return {
        "quick": quick,
        "ledger_sync": ledger_sync(),
        "concurrency": concurrency,
        "seconds_per_rate": seconds,
        "round_trips": count,
        "floor_rounds": rounds,
        "raw_client_throughput": rate_client,
        "raw_client_one_hop": hop_client,
        "raw": {
            "commands_per_second": raw_rates[rate_client]["commands_per_second"],
            "cpu_ms_per_command_python": raw_rates[rate_client]["cpu_ms_per_command_python"],
            "one_hop_p50_ms": raw_hops[hop_client]["p50_ms"],
        },
        "throughput": rates,
        "one_hop": hops,
        "ratios": ratios(rates, hops),
        "seconds": round(time.perf_counter() - started, 1),
    }


async def floor_profile(
    bench: BenchBroker, concurrency: int, seconds: float, *, client: str
) -> dict[str, Any]:
    """Profile the floor's own throughput tree (RawNode + GroupJournal) for `seconds`."""

    def journal(name: str) -> GroupJournal:
        return GroupJournal(bench.workdir / f"parts-profile-{name}.db")

    async with AsyncExitStack() as stack:
        nodes = await throughput.raw_tree(stack, bench, journal, client)
        root = bench.id("root")

        async def call() -> None:
            await nodes["operator"].request(root, PARAMS)

        return await profiled(call, concurrency, seconds)


def ratios(
    rates: dict[str, dict[str, Any]], hops: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Return each variant over the floor, and VOX over each variant, for the three measures."""
    measures: dict[str, Callable[[str], float]] = {
        "commands_per_second": lambda v: float(rates[v]["commands_per_second"]),
        "cpu_ms_per_command": lambda v: float(rates[v]["cpu_ms_per_command_python"]),
        "one_hop_p50_ms": lambda v: float(hops[v]["p50_ms"]),
    }
    out: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        out[f"{variant} / floor"] = {
            key: round(get(variant) / get(FLOOR), 2) for key, get in measures.items()
        }
    for variant in VARIANTS[:-1]:
        out[f"vox / {variant}"] = {
            key: round(get(VOX) / get(variant), 2) for key, get in measures.items()
        }
    return out


def table(result: dict[str, Any]) -> str:
    """Return the result as a small plain-text table."""
    rates, hops = result["throughput"], result["one_hop"]
    lines = [
        f"{'variant':<24}{'commands/s':>12}{'CPU ms/cmd':>12}{'1-hop p50 ms':>14}"
        f"{'1-hop CPU ms':>14}",
    ]
    raw = result["raw"]
    lines.append(
        f"{'(raw, no obligations)':<24}{raw['commands_per_second']:>12.1f}"
        f"{raw['cpu_ms_per_command_python']:>12.3f}{raw['one_hop_p50_ms']:>14.3f}{'':>14}"
    )
    for variant in VARIANTS:
        rate, hop = rates[variant], hops[variant]
        lines.append(
            f"{variant:<24}{rate['commands_per_second']:>12.1f}"
            f"{rate['cpu_ms_per_command_python']:>12.3f}{hop['p50_ms']:>14.3f}"
            f"{hop['cpu_ms_per_round_trip_python']:>14.3f}"
        )
    lines += ["", f"{'ratio':<30}{'commands/s':>12}{'CPU ms/cmd':>12}{'1-hop p50':>12}"]
    for name, values in result["ratios"].items():
        lines.append(
            f"{name:<30}{values['commands_per_second']:>11.2f}x"
            f"{values['cpu_ms_per_command']:>11.2f}x{values['one_hop_p50_ms']:>11.2f}x"
        )
    return "\n".join(lines)


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Return figure 22's rows: VOX against the floor that keeps both guarantees.

    Issue 41's targets are against the floor (figures 1 and 3); these rows report, beside
    them, how VOX stands against the floor with its envelope and ledger added. No target of
    its own: `met` is None (bench/report.py prints "-").
    """
    rates, hops, full = result["throughput"], result["one_hop"], LEDGER
    common = {"layout": "all-in-one", "detail": result}
    return [
        {
            "title": "Throughput (figure 3's shape) against the floor with envelope and ledger",
            "unit": "commands/s",
            "vox": rates[VOX]["commands_per_second"],
            "baseline": rates[full]["commands_per_second"],
            "ratio": round(
                rates[VOX]["commands_per_second"] / rates[full]["commands_per_second"], 2
            ),
            "target": "reported beside figure 3 (its target is against the floor)",
            "met": None,
            "higher_is_better": True,
            "floor_kept_by_guarantees": round(
                rates[full]["commands_per_second"] / rates[FLOOR]["commands_per_second"], 2
            ),
            **common,
        },
        {
            "title": "One hop (figure 1's shape) against the floor with envelope and ledger (p50)",
            "unit": "ms",
            "vox": hops[VOX]["p50_ms"],
            "baseline": hops[full]["p50_ms"],
            "ratio": round(hops[VOX]["p50_ms"] / hops[full]["p50_ms"], 2),
            "target": "reported beside figure 1 (its target is against the floor)",
            "met": None,
            "higher_is_better": False,
        },
    ]


def run(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Figure 22 (python -m bench --only floor_parts): every variant, then the rows."""
    result = asyncio.run(measure(workdir, quick, None))
    print(table(result), file=sys.stderr)
    return rows_of(result)


def main(argv: list[str] | None = None) -> int:
    """Run every variant in both shapes, print the table, then the numbers as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run, for development")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument(
        "--profile",
        choices=VARIANTS,
        help="also run this variant's throughput under cProfile (not in its figures)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vox-bench-parts-") as tmp:
        result = asyncio.run(measure(Path(tmp), args.quick, args.profile))
    print(table(result))
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
