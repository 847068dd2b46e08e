"""A fleet too big to draw row by row, summarised (docs/web.md, docs/operations.md).

Above `SUMMARY_ABOVE` agents, `vox watch` and the web console's tree show counts instead of
every row: per state over the fleet, per site and state, the sites with the most unhealthy
agents first, and the first few unhealthy agents by name, the worst first. A person looks
for what is wrong; ten thousand green rows hide it. Pure: it counts what it is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "LOCAL_SITE",
    "MISBEHAVING",
    "SHOWN_UNHEALTHY",
    "SUMMARY_ABOVE",
    "FleetSummary",
    "SiteTally",
    "summarise",
]

SUMMARY_ABOVE: Final = 1000  # agents: above it, a view summarises instead of drawing rows
SHOWN_UNHEALTHY: Final = 20  # unhealthy agents named in a summary
LOCAL_SITE: Final = "this site"  # the agents no bridge leads to
MISBEHAVING: Final = "MISBEHAVING"  # its last status broke a bound (docs/liveness.md)
# The worst first: what a person must look at before anything else.
_WORST: Final = ("UNREACHABLE", "INACTIVE", MISBEHAVING, "STALE", "DEGRADED", "UNKNOWN")
_HEALTHY: Final = "ACTIVE"


def _rank(state: str) -> int:
    if state in _WORST:
        return _WORST.index(state)
    return len(_WORST) + (1 if state == _HEALTHY else 0)  # any other state before ACTIVE


def _ordered(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (_rank(item[0]), item[0])))


@dataclass(frozen=True)
class SiteTally:
    """One site's agents: how many, how many per state (the worst first), how many unhealthy."""

    site: str
    total: int
    states: tuple[tuple[str, int], ...]
    unhealthy: int


@dataclass(frozen=True)
class FleetSummary:
    """The counts a view shows instead of every row."""

    total: int
    states: tuple[tuple[str, int], ...]  # the worst first
    sites: tuple[SiteTally, ...]  # the most unhealthy first, then by name
    unhealthy: tuple[tuple[str, str, str], ...]  # (name, state, site), the worst first
    unhealthy_total: int
    refs: tuple[str | None, ...] = ()  # what each unhealthy one is found by (an id), if given

    def lines(self) -> list[str]:
        """Return the summary as plain lines (`vox watch`)."""
        head = ", ".join(f"{count} {state}" for state, count in self.states)
        out = [f"{self.total} agents, summarised: {head}"]
        for tally in self.sites:
            states = ", ".join(f"{count} {state}" for state, count in tally.states)
            out.append(f"  site {tally.site}: {tally.total} agents: {states}")
        if self.unhealthy:
            more = self.unhealthy_total - len(self.unhealthy)
            out.append(
                f"unhealthy, the worst first ({self.unhealthy_total}"
                + (f"; {more} more not named" if more else "")
                + "):"
            )
            out += [f"  {name} {state} (site {site})" for name, state, site in self.unhealthy]
        return out

    def _refs(self) -> tuple[str | None, ...]:
        return self.refs or (None,) * len(self.unhealthy)

    def as_dict(self) -> dict[str, Any]:
        """Return it as JSON-ready data (the web console's tree)."""
        return {
            "total": self.total,
            "states": [list(s) for s in self.states],
            "sites": [
                {
                    "site": t.site,
                    "total": t.total,
                    "states": [list(s) for s in t.states],
                    "unhealthy": t.unhealthy,
                }
                for t in self.sites
            ],
            "unhealthy": [[*u, ref] for u, ref in zip(self.unhealthy, self._refs(), strict=True)],
            "unhealthy_total": self.unhealthy_total,
        }


def summarise(
    agents: Iterable[tuple[str, str, str | None]],
    *,
    shown: int = SHOWN_UNHEALTHY,
    refs: Iterable[str | None] | None = None,
) -> FleetSummary:
    """Count (name, state, site or None) agents per state and per site, the worst first.

    A misbehaving agent is given as state MISBEHAVING by the caller; None is this site.
    refs, one per agent in the same order, is what a view finds each by (the web page
    links an unhealthy agent to its page by its id).
    """
    states: Counter[str] = Counter()
    per_site: dict[str, Counter[str]] = {}
    unhealthy: list[tuple[str, str, str, str | None]] = []
    given = iter(refs) if refs is not None else None
    for name, state, site in agents:
        ref = None if given is None else next(given, None)
        place = LOCAL_SITE if site is None else site
        states[state] += 1
        per_site.setdefault(place, Counter())[state] += 1
        if state != _HEALTHY:
            unhealthy.append((name, state, place, ref))
    tallies = [
        SiteTally(
            site=site,
            total=sum(counts.values()),
            states=_ordered(counts),
            unhealthy=sum(n for s, n in counts.items() if s != _HEALTHY),
        )
        for site, counts in per_site.items()
    ]
    tallies.sort(key=lambda t: (-t.unhealthy, t.site))
    unhealthy.sort(key=lambda u: (_rank(u[1]), u[0]))
    return FleetSummary(
        total=sum(states.values()),
        states=_ordered(states),
        sites=tuple(tallies),
        unhealthy=tuple((n, s, p) for n, s, p, _ in unhealthy[:shown]),
        unhealthy_total=len(unhealthy),
        refs=tuple(ref for *_, ref in unhealthy[:shown]) if refs is not None else (),
    )
