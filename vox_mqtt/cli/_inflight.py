"""The requests an agent serves right now, by state, as `vox status` shows them.

Read from the gauges of its last heartbeat (docs/metrics.md: `requests_received`,
`requests_working`, `requests_delegated`); an agent whose heartbeat carries none of them
(an older version, metrics off) shows "-".
"""

from __future__ import annotations

from typing import Any, Final

from vox_mqtt.observe.metrics import parse_snapshot

__all__ = ["IN_FLIGHT_STATES", "in_flight", "in_flight_text"]

IN_FLIGHT_STATES: Final = ("received", "working", "delegated")


def in_flight(metrics: dict[str, Any] | None) -> dict[str, int] | None:
    """Return {state: count} of the requests an agent serves now, or None if it did not say."""
    snapshot = parse_snapshot((metrics or {}).get("agent"))
    if snapshot is None:
        return None
    counts = {s: snapshot.gauges.get(f"requests_{s}") for s in IN_FLIGHT_STATES}
    if all(value is None for value in counts.values()):
        return None
    return {state: int(value or 0) for state, value in counts.items()}


def in_flight_text(counts: dict[str, int] | None) -> str:
    """Return the counts as a cell: "1 working, 2 delegated", "0", or "-" when unknown."""
    if counts is None:
        return "-"
    parts = [f"{n} {state}" for state, n in counts.items() if n]
    return ", ".join(parts) or "0"
