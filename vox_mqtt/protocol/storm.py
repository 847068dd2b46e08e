"""Storm control: how a fleet comes back after a broker restart, and which losses are its echo.

Pure rules, no state (docs/federation.md, "Restarts and partitions: what an operator can
expect"; docs/liveness.md, "What a master does"):

- **Reconnect spread.** After a lost connection each agent waits a random moment within
  `reconnect_spread(agents on its broker)` before its first try, then within a window twice
  as long after each failure, at most `reconnect_max` (`backoff_window`). The births of a
  broker's agents then reach it at `CONNECTS_PER_SECOND` on average, whatever the fleet.
- **Bridges** retry on Mosquitto's own decorrelated jitter, from `BRIDGE_RESTART_BASE` up
  to a cap sized like the spread, to the agents whose births the upstream's bridges carry
  (`bridge_restart_timeout`).
- **Grace after a reconnect.** A child's loss this agent sees within
  `reconnect_grace(window, child_silence(...))` of its own reconnect (window: the backoff
  window it reconnected in) may be the restart's echo: a will the broker sent as it
  stopped, kept in this agent's persistent session and delivered after its reconnect
  while the child is being reborn, or a heartbeat still on its way across a bridge. It is
  held until the grace ends and posted only if the child is not back by then
  (`hold_loss`).
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "BRIDGE_RESTART_BASE",
    "BRIDGE_RESTART_CAP",
    "CONNECTS_PER_SECOND",
    "MIN_SPREAD",
    "RECONNECT_MAX",
    "SETTLE",
    "backoff_window",
    "bridge_restart_timeout",
    "child_silence",
    "hold_loss",
    "reconnect_cap",
    "reconnect_grace",
    "reconnect_spread",
]

# Births (a connection, its subscriptions, a retained status and presence) a broker is
# handed per second on average after a restart: a quarter of the burst Mosquitto took in
# figure 9 (1,000 in about half a second on the 2-core VM), so it keeps most of a core for
# the traffic that goes on meanwhile.
CONNECTS_PER_SECOND: Final = 500.0
MIN_SPREAD: Final = 0.5  # seconds; below this a small fleet gains nothing
RECONNECT_MAX: Final = 30.0  # the backoff's cap for a fleet whose spread is below it
BRIDGE_RESTART_BASE: Final = 1  # seconds, Mosquitto's restart_timeout takes whole seconds
BRIDGE_RESTART_CAP: Final = 10
# Seconds a loaded host may take between a will published on takeover and the birth of
# the same agent, or between a reconnect and the first heartbeat it brings.
SETTLE: Final = 2.0


def reconnect_spread(agents: int, *, rate: float = CONNECTS_PER_SECOND) -> float:
    """Return the window of an agent's first reconnect try: agents / rate, at least MIN_SPREAD.

    agents: how many agents live on its broker (they all lose it together).
    """
    return max(MIN_SPREAD, max(agents, 0) / rate)


def reconnect_cap(spread: float) -> float:
    """Return the backoff's cap for a spread: RECONNECT_MAX, or the spread if larger."""
    return max(RECONNECT_MAX, spread)


def backoff_window(spread: float, failures: int, cap: float) -> float:
    """Return the window of the next try after `failures` tries in a row: spread * 2**failures.

    Full jitter: the try comes at a moment drawn uniformly within it; at most cap.
    """
    return min(cap, spread * 2.0 ** min(max(failures, 0), 32))


def bridge_restart_timeout(agents_behind: int) -> tuple[int, int]:
    """Return (base, cap) of `restart_timeout` for the bridges into one upstream broker.

    agents_behind: the agents behind all of that broker's bridges; their births cross
    them after a restart, so the cap grows like the agents' own spread.
    """
    spread = math.ceil(reconnect_spread(agents_behind))
    return BRIDGE_RESTART_BASE, max(BRIDGE_RESTART_CAP, spread)


def child_silence(heartbeat_interval: float, stale_after: float, cap: float) -> float:
    """Return how long a child that is fine may go unheard once its broker is back.

    Its next try may wait up to its backoff's cap (a try that failed while the broker was
    down doubled its window), and then its birth may take as long as any agent may stay
    silent (stale_after heartbeats): a host that hosts many of the broker's agents reborn
    them one after the other (figure 16: a thousand in one process took about a minute).
    """
    return cap + stale_after * heartbeat_interval


def reconnect_grace(window: float, heard_within: float) -> float:
    """Return how long after a reconnect a loss may still be the restart's echo.

    window: the backoff window this agent reconnected in (its children on the same broker
    reconnect within about the same); heard_within: the seconds within which the lost one
    is heard again once the broker is back: a child's `child_silence`, a bridge's
    restart_timeout cap.
    """
    return window + heard_within + SETTLE


def hold_loss(
    *,
    now: float,
    seen_at: float,
    reconnected_at: float | None,
    window: float,
    heard_within: float,
) -> bool:
    """Return whether a child's loss is held back rather than posted now.

    seen_at: when this agent saw the loss (a will's arrival, the moment a heartbeat went
    stale, a link's "0"); window, heard_within: as for reconnect_grace; reconnected_at:
    this agent's latest reconnect (None: never reconnected, a first connection is no
    restart). A loss seen within the grace after the reconnect is
    held until that grace ends; one seen later counts at once.
    """
    if reconnected_at is None or seen_at < reconnected_at:
        return False
    end = reconnected_at + reconnect_grace(window, heard_within)
    return seen_at < end and now < end
