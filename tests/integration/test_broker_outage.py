"""Commands flowing through a broker restart are each answered exactly once (issue #27 item 3).

Two sites of 5 agents behind their own brokers, bridged to a core holding the root and the
site masters (stormkit's fleet, agents in worker processes). The operator sends each site a
command every 0.25 s from 2 s before a broker goes until 2 s after every agent is heard live
ACTIVE again; the broker is stopped (SIGTERM: it sends its clients' wills) and, in a second
round, killed (SIGKILL: a crash, which docs/broker.md has systemd restart), down 2 s each
time. Afterwards every command the operator's outbox accepted has exactly one answer at the
operator, a result or an error (refused at once, NO_ROUTE while its agent reads INACTIVE),
as its ledger file records and as a raw capture of its inbox on the core saw; no answer
twice, nothing run twice, every result one execution (docs/federation.md, "Restarts and
partitions").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.kits.federationkit import running_federation
from tests.kits.outagekit import (
    How,
    Run,
    answers_witness,
    check_answered_once,
    commands_through_restart,
    operator_ledger,
    raw_answers,
)
from tests.kits.stormkit import BRIDGE_KEEPALIVE, sites_fleet, tally, workers

pytestmark = pytest.mark.slow

SITES = 2
PER_SITE = 5
# What an answer may be besides a result: refused at once while the agent reads INACTIVE
# (its broker sent its will as it stopped) or its master is being reborn (docs/federation.md).
REFUSED = {"NO_ROUTE", "TARGET_INACTIVE"}
HOWS: tuple[How, ...] = ("SIGTERM", "SIGKILL")
SETTLE = 0.5  # s: a fresh look on the core and the root may read a rebirth that far apart


def _restarts(tmp_path: Path, broker: str) -> list[Run]:
    tally_file = tmp_path / "tally.txt"
    fleet = sites_fleet(tally_file, sites=SITES, per_site=PER_SITE)
    runs = []
    with running_federation(
        tmp_path / "fed", fleet, bridge_keepalive=BRIDGE_KEEPALIVE
    ) as fed, workers(fed):  # fmt: skip
        witness = answers_witness(fed)
        try:
            for how in HOWS:
                run = asyncio.run(commands_through_restart(fed, broker, how, SITES))
                print(run.summary())
                runs.append(run)
        finally:
            witness.close()
    ledger = operator_ledger(fed)
    raw = raw_answers(witness)
    ran = tally(tally_file)
    for run in runs:
        missed = check_answered_once(run, ledger, raw, ran)
        print(f"{run.broker} {run.how}: the raw capture missed {missed} answers")
        outcomes = {s.outcome for s in run.sent.values()}
        assert outcomes <= {"result"} | REFUSED, (run.how, outcomes)
        # Commands sent after every agent was back (and the root had a moment to read it
        # too: SETTLE) are all answered with a result.
        back = run.down_for + run.back_after + SETTLE
        late = [s for s in run.sent.values() if s.at > back]
        assert late, run.summary()
        assert all(s.outcome == "result" for s in late), run.summary()
    return runs


@pytest.mark.timeout(240)
def test_commands_through_a_site_restart_are_answered_exactly_once(tmp_path: Path) -> None:
    for run in _restarts(tmp_path, "site-0"):
        # The other site never noticed: every command to it has its result.
        other = [s for s in run.sent.values() if s.site == 1]
        assert all(s.outcome == "result" for s in other), run.summary()


@pytest.mark.timeout(240)
def test_commands_through_a_core_restart_are_answered_exactly_once(tmp_path: Path) -> None:
    _restarts(tmp_path, "core")
