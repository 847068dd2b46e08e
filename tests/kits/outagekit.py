"""Commands sent without pause through a broker restart, and what became of each one.

What tests/integration/test_broker_outage.py shares (issue #27 item 3: "every command
accepted before or during the outage is answered exactly once"; docs/federation.md,
"Restarts and partitions"). The fleet is stormkit's at a small size (root and site masters
on the core, each site's agents behind its own broker, in worker processes); the operator
sends a tally command to every site every STEP seconds while one broker is stopped (SIGTERM)
or killed (SIGKILL) and started again. What each command became is read three ways:

- the operator's ledger (its real SQLite file, read after the console closed): each
  `command_request` it sent, the answers it recorded `received`, `duplicate` or `late`
  with that request as `reply_to`, and its own `expired`/`failed` end of it;
- a raw capture on the core (`mosquitto_sub` as the explorer, its session kept through the
  restart): every answer published to the operator's inbox, by message id;
- the tally the serving role writes, one line per execution.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Literal

from tests.kits.brokerkit import Witness
from tests.kits.federationkit import Federation
from tests.kits.fleetproc import wait_for_route
from tests.kits.lifecyclekit import witnessed
from tests.kits.stormkit import all_back, back_bound, epochs
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import CommandFailed

STEP = 0.25  # one command to each site every STEP s
LEAD = 2.0  # sending before the broker goes
DOWN = 2.0  # the broker stays down this long
TAIL = 2.0  # sending after every agent is back
WAIT = 60.0  # each command's deadline: far past the outage, so none ends TIMEOUT by it

How = Literal["SIGTERM", "SIGKILL"]


@dataclass
class Sent:
    """One command as the operator's code saw it."""

    tag: str
    site: int
    at: float  # seconds from the broker's stop (negative: before it)
    outcome: str = ""  # "result", or the error code it was answered with


@dataclass
class Run:
    """One restart with commands flowing: when things happened and what each command got."""

    broker: str
    how: How
    sent: dict[str, Sent] = field(default_factory=dict)
    down_for: float = 0.0  # from the stop until the broker listened again
    back_after: float = 0.0  # from its start until every agent was heard live ACTIVE
    settled_after: float = 0.0  # from its start until the last command was answered

    @property
    def witness_kept(self) -> bool:
        """Whether the raw capture's session on the core outlived this restart."""
        return not (self.broker == "core" and self.how == "SIGKILL")

    def phase(self, sent: Sent) -> str:
        if sent.at < 0:
            return "before"
        return "during" if sent.at < self.down_for else "after"

    def summary(self) -> str:
        counts: Counter[tuple[str, int, str]] = Counter(
            (self.phase(s), s.site, s.outcome) for s in self.sent.values()
        )
        rows = ", ".join(f"{p} site-{site} {o}: {n}" for (p, site, o), n in sorted(counts.items()))
        return (
            f"{self.broker} {self.how}: down {self.down_for:.1f} s, all ACTIVE "
            f"{self.back_after:.1f} s after its start, last answer {self.settled_after:.1f} s "
            f"after it; {len(self.sent)} commands: {rows}"
        )


def answers_witness(fed: Federation) -> Witness:
    """Return a raw capture of everything published to the operator's inbox on the core,
    whose session (kept 600 s) outlives a restart of the core."""
    creds = fed.creds("core", "explorer")
    inbox = f"vox/{fed.fleet.operator_id}/inbox/#"
    witness = Witness(creds, inbox, fmt="%t %p", session_expiry=600)
    deadline = time.monotonic() + 20
    while f"as {creds.username} " not in fed.brokers["core"].log_text():
        assert time.monotonic() < deadline, "the answers' witness did not connect"
        time.sleep(0.1)
    return witness


async def _stop(fed: Federation, broker: str, how: How) -> None:
    server = fed.brokers[broker]
    await asyncio.to_thread(server.stop if how == "SIGTERM" else server.kill)


async def commands_through_restart(fed: Federation, broker: str, how: How, sites: int) -> Run:
    """Send each site a command every STEP s from LEAD s before `broker` stops until TAIL s
    after every agent is back; return what each command was answered."""
    before = await epochs(fed, 60)
    reconnected = {a.id for a in fed.fleet if (a.broker or "core") == broker}
    run = Run(broker, how)
    futures: dict[str, asyncio.Future[str]] = {}
    async with OperatorConsole(fed.operator_config, observe=[topics.STATUS_FILTER]) as console:
        for s in range(sites):
            await wait_for_route(console, f"count_site_{s}", timeout=60)
        stopped_at = time.monotonic() + LEAD
        done = asyncio.Event()

        async def send() -> None:
            n = 0
            while not done.is_set():
                for s in range(sites):
                    tag = f"{broker}-{how}-{s}-{n}"
                    run.sent[tag] = Sent(tag, s, time.monotonic() - stopped_at)
                    futures[tag] = asyncio.ensure_future(_answer(console, s, tag))
                n += 1
                await asyncio.sleep(STEP)

        sender = asyncio.create_task(send())
        await asyncio.sleep(LEAD)
        await _stop(fed, broker, how)
        await asyncio.sleep(max(0.0, stopped_at + DOWN - time.monotonic()))
        await asyncio.to_thread(fed.brokers[broker].start)
        started = time.monotonic()
        run.down_for = started - stopped_at
        run.back_after = await all_back(fed, before, reconnected, back_bound(fed, broker))
        await asyncio.sleep(TAIL)
        done.set()
        await sender
        outcomes = await asyncio.wait_for(asyncio.gather(*futures.values()), WAIT + 30)
        run.settled_after = time.monotonic() - started
    for tag, outcome in zip(futures, outcomes, strict=True):
        run.sent[tag].outcome = outcome
    return run


async def _answer(console: OperatorConsole, site: int, tag: str) -> str:
    try:
        reply = await console.send_command(f"count_site_{site}", {"tag": tag}, wait=WAIT)
    except CommandFailed as exc:
        return exc.code
    assert reply.details["result"]["tag"] == tag, (tag, reply.details)
    return "result"


@dataclass
class Ledgered:
    """One command_request as the operator's ledger has it."""

    message_id: str
    tag: str
    answers: dict[str, list[str]]  # answer message id -> actions recorded for it
    ends: list[str]  # the sender's own end of it: "expired:TIMEOUT", "failed:CODE"


def operator_ledger(fed: Federation) -> dict[str, Ledgered]:
    """Read the operator's ledger file (after its console closed): {tag: Ledgered}."""
    path = fed.root / "console" / "logs.db"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT action, message_id, message_type, reply_to, outcome, details FROM logs "
            "WHERE message_type IN ('command_request', 'command_result', 'command_error') "
            "ORDER BY id"
        ).fetchall()
    finally:
        db.close()
    by_id: dict[str, Ledgered] = {}
    replies: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for action, message_id, kind, reply_to, outcome, details in rows:
        if kind == "command_request" and action == "sent":
            tag = json.loads(details)["params"]["tag"]
            by_id[message_id] = Ledgered(message_id, tag, {}, [])
        elif kind == "command_request":
            by_id[message_id].ends.append(f"{action}:{outcome}")
        else:
            replies[reply_to][message_id].append(action)
    for request_id, answers in replies.items():
        by_id[request_id].answers = dict(answers)
    return {entry.tag: entry for entry in by_id.values()}


def raw_answers(witness: Witness) -> dict[str, set[str]]:
    """{request id: the distinct ids of the answers the raw capture saw to it}."""
    seen: dict[str, set[str]] = defaultdict(set)
    for kind in ("command_result", "command_error"):
        for _, message in witnessed(witness, kind):
            seen[str(message.get("reply_to"))].add(str(message["message_id"]))
    return seen


def check_answered_once(
    run: Run, ledger: dict[str, Ledgered], raw: dict[str, set[str]], ran: list[str]
) -> int:
    """Every command the operator's outbox accepted has exactly one answer at its sender (a
    result, or an error: refused at once or ended by the sender), recorded once, and the
    wire carried no other; nothing ran twice, and each result is one execution.

    The raw capture must have seen every answer too, unless its session died with the core
    (SIGKILL: what the core delivered before the capture was back is not in it); return how
    many answers it missed."""
    problems = []
    missed = 0
    for tag, sent in run.sent.items():
        entry = ledger.get(tag)
        if entry is None:
            problems.append(f"{tag}: not in the operator's ledger")
            continue
        received = [a for a, acts in entry.answers.items() if "received" in acts]
        late = [a for a, acts in entry.answers.items() if "late" in acts]
        if len(received) + len(entry.ends) != 1 or late:
            problems.append(f"{tag} ({run.phase(sent)}): answers {entry.answers} ends {entry.ends}")
        on_wire = raw.get(entry.message_id, set())
        if not on_wire <= set(received) or (run.witness_kept and set(received) != on_wire):
            problems.append(f"{tag}: ledger received {received}, the wire carried {on_wire}")
        missed += bool(set(received) - on_wire)
        executions = ran.count(tag)
        if executions != (1 if sent.outcome == "result" else executions) or executions > 1:
            problems.append(f"{tag}: answered {sent.outcome}, ran {executions} times")
    assert not problems, f"{len(problems)} commands not answered exactly once: {problems[:10]}"
    return missed
