"""A master as its children's witness: their ledger heads recorded, and checked against later."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from vox_mqtt.ledger.store import GENESIS_HASH, VOXAgentMemory
from vox_mqtt.protocol.errors import LedgerError

__all__ = [
    "WITNESS_BURST",
    "WITNESS_FINAL_BURST",
    "WITNESS_FINAL_RATE",
    "WITNESS_RATE",
    "HeadWitness",
    "RateBudget",
    "WitnessReport",
    "check_against_witness",
]

# How many heads of one child a master records (docs/liveness.md): a burst of this many,
# then this many per second; a child's final heads (on SHUTDOWN) have a budget of their
# own. What comes faster is counted (`witness_skipped`), not recorded: the next head
# recorded vouches for every row before it anyway.
WITNESS_BURST: Final = 8
WITNESS_RATE: Final = 1.0
WITNESS_FINAL_BURST: Final = 2
WITNESS_FINAL_RATE: Final = 0.1


class RateBudget:
    """A token bucket: `burst` at once, then `rate` per second (the clock is given)."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, burst: float, rate: float) -> None:
        self.burst = burst
        self.rate = rate
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        """Spend one if there is one at now; tell whether there was."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class HeadWitness:
    """Record each child's reported ledger head in this agent's ledger, once per change.

    At a bounded rate per child (WITNESS_BURST, WITNESS_RATE): a head that comes faster
    is not recorded, and `on_skip` is told.
    """

    def __init__(
        self,
        memory: VOXAgentMemory,
        *,
        on_skip: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._memory = memory
        # The newest head recorded per child, so an idle child costs no rows.
        self._last: dict[UUID, tuple[tuple[int, str], bool]] = {}
        self._budgets: dict[tuple[UUID, bool], RateBudget] = {}
        self._on_skip = on_skip
        self._clock = clock
        self.skipped = 0

    def _admits(self, child: UUID, final: bool) -> bool:
        key = (child, final)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = (
                RateBudget(WITNESS_FINAL_BURST, WITNESS_FINAL_RATE)
                if final
                else RateBudget(WITNESS_BURST, WITNESS_RATE)
            )
        if budget.take(self._clock()):
            return True
        self.skipped += 1
        if self._on_skip is not None:
            self._on_skip()
        return False

    async def saw(self, child: UUID, head: tuple[int, str], *, final: bool = False) -> bool:
        """Record a child's head unless it is the one recorded last; tell whether it was.

        final: the child's last word before stopping (its SHUTDOWN status). A head that
        comes faster than the child's budget is not recorded (False, counted).
        """
        before = self._last.get(child)
        if before in ((head, final), (head, True)):
            return False
        if not self._admits(child, final):
            return False
        # Claimed before the write, so two statuses arriving together record it once.
        self._last[child] = (head, final)
        try:
            await self._memory.record_witness(child, head, final=final)
        except BaseException:
            if self._last.get(child) == (head, final):  # not recorded: try it next time
                if before is None:
                    self._last.pop(child, None)
                else:
                    self._last[child] = before
            raise
        return True


@dataclass(frozen=True, kw_only=True)
class WitnessReport:
    """How a ledger compares with the heads its master witnessed."""

    ok: bool
    agent: UUID
    heads: int  # witnessed heads compared
    last_agreed: dict[str, Any] | None  # the newest witnessed head the ledger still holds
    first_disagreed: dict[str, Any] | None  # the oldest one it does not
    unwitnessed: int  # rows after the newest witnessed head: nobody vouches for them yet
    problem: str | None
    note: str | None = None


def _head(row: dict[str, Any]) -> dict[str, Any]:
    details = row["details"]
    return {
        "row": int(details["row"]),
        "hash": str(details["hash"]),
        "at": row["recorded_at"],
        "final": details.get("final") is True,
    }


async def check_against_witness(
    ledger: VOXAgentMemory, witness: VOXAgentMemory, agent: UUID | None = None
) -> WitnessReport:
    """Compare a ledger with every head of it that a master recorded; name where they part."""
    rows = await witness.witnessed_heads(agent)
    if agent is None:
        agent = await _whose(ledger, rows)
        rows = [r for r in rows if r["source"] == str(agent)]
    heads = [_head(r) for r in rows if isinstance(r["details"].get("row"), int)]
    last_row = (await ledger.head())[0]
    if not heads:
        problem = f"the witness holds no ledger head of {agent}"
        return _report(agent, heads, None, None, last_row, problem)
    stored = await ledger.row_hashes(h["row"] for h in heads)
    stored[0] = GENESIS_HASH  # an empty ledger's head: every ledger starts there
    agreed: dict[str, Any] | None = None
    for head in heads:
        found = stored.get(head["row"])
        if found == head["hash"]:
            agreed = head
            continue
        since = f"since row {head['row']}, witnessed at {head['at']}"
        if found is None:
            problem = f"it ends at row {last_row}: rows were removed {since}"
        else:
            problem = f"row {head['row']} is not the row its master saw: rewritten {since}"
        if agreed is not None:
            problem += f" (it last agreed at row {agreed['row']}, witnessed at {agreed['at']})"
        return _report(agent, heads, agreed, head, 0, problem)
    newest = heads[-1]
    extra = max(0, last_row - newest["row"])
    if not extra:
        return _report(agent, heads, agreed, None, 0, None)
    rows_text = f"rows {newest['row'] + 1}-{last_row}"
    if newest["final"]:
        # The child's own last word, on stopping, said its ledger ended there.
        problem = (
            f"{rows_text} follow the head it reported when it stopped (row {newest['row']},"
            f" witnessed at {newest['at']}): they were added since"
        )
        return _report(agent, heads, agreed, None, extra, problem)
    note = (
        f"{rows_text} came after the newest head its master witnessed (row {newest['row']}"
        f" at {newest['at']}): nothing vouches for them yet"
    )
    return _report(agent, heads, agreed, None, extra, None, note)


def _report(
    agent: UUID,
    heads: list[dict[str, Any]],
    agreed: dict[str, Any] | None,
    disagreed: dict[str, Any] | None,
    unwitnessed: int,
    problem: str | None,
    note: str | None = None,
) -> WitnessReport:
    return WitnessReport(
        ok=problem is None,
        agent=agent,
        heads=len(heads),
        last_agreed=agreed,
        first_disagreed=disagreed,
        unwitnessed=unwitnessed,
        problem=problem,
        note=note,
    )


async def _whose(ledger: VOXAgentMemory, rows: list[dict[str, Any]]) -> UUID:
    """Tell which witnessed child this ledger belongs to: the one whose heads it matches most."""
    by_child: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_child.setdefault(str(row["source"]), []).append(row)
    if not by_child:
        raise LedgerError("the witness holds no ledger heads at all")
    if len(by_child) == 1:
        return UUID(next(iter(by_child)))
    matches: Counter[str] = Counter()
    for child, found in by_child.items():
        heads = [_head(r) for r in found]
        stored = await ledger.row_hashes(h["row"] for h in heads)
        matches[child] = sum(stored.get(h["row"]) == h["hash"] for h in heads)
    (best, count), *rest = matches.most_common()
    if count == 0 or (rest and rest[0][1] == count):
        raise LedgerError(
            f"the witness holds heads of {len(by_child)} agents; name this ledger's with --agent"
        )
    return UUID(best)
