"""A fleet too big to draw is summarised: counts per state and per site, the worst first."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from vox_mqtt.observe.summary import LOCAL_SITE, MISBEHAVING, summarise


def fleet() -> list[tuple[str, str, str | None]]:
    agents: list[tuple[str, str, str | None]] = [
        (f"a{n:05d}", "ACTIVE", None if n % 2 else "north") for n in range(10_000)
    ]
    agents[7] = ("a00007", "INACTIVE", None)
    agents[8] = ("a00008", "STALE", "north")
    agents[10] = ("a00010", MISBEHAVING, "north")
    agents[12] = ("zz", "UNREACHABLE", "north")
    agents[14] = ("b", "DEGRADED", "north")
    return agents


def test_ten_thousand_agents_are_counted_per_state_the_worst_first() -> None:
    summary = summarise(fleet())
    assert summary.total == 10_000
    assert summary.states == (
        ("UNREACHABLE", 1),
        ("INACTIVE", 1),
        (MISBEHAVING, 1),
        ("STALE", 1),
        ("DEGRADED", 1),
        ("ACTIVE", 9_995),
    )


def test_the_site_with_most_unhealthy_agents_comes_first() -> None:
    summary = summarise(fleet())
    assert [(t.site, t.total, t.unhealthy) for t in summary.sites] == [
        ("north", 5_000, 4),
        (LOCAL_SITE, 5_000, 1),
    ]
    assert summary.sites[0].states[0] == ("UNREACHABLE", 1)


def test_the_unhealthy_are_named_worst_first_and_the_rest_counted() -> None:
    summary = summarise(fleet(), shown=3)
    assert summary.unhealthy == (
        ("zz", "UNREACHABLE", "north"),
        ("a00007", "INACTIVE", LOCAL_SITE),
        ("a00010", MISBEHAVING, "north"),
    )
    assert summary.unhealthy_total == 5
    lines = summary.lines()
    assert lines[0].startswith("10000 agents, summarised: 1 UNREACHABLE, 1 INACTIVE")
    assert "  site north: 5000 agents: 1 UNREACHABLE, " in lines[1]
    assert "unhealthy, the worst first (5; 2 more not named):" in lines
    assert summary.as_dict()["sites"][0]["site"] == "north"
    assert summary.as_dict()["unhealthy"][0] == ["zz", "UNREACHABLE", "north", None]


def test_a_healthy_fleet_names_nobody() -> None:
    summary = summarise([("a", "ACTIVE", None), ("b", "ACTIVE", "x")])
    assert summary.unhealthy == ()
    assert summary.lines() == [
        "2 agents, summarised: 2 ACTIVE",
        "  site this site: 1 agents: 1 ACTIVE",
        "  site x: 1 agents: 1 ACTIVE",
    ]


def big_observer(count: int) -> tuple[Any, Any]:
    from uuid import uuid4

    from vox_mqtt.observe.observer import FleetObserver

    top = uuid4()
    observer = FleetObserver()
    for n in range(count):
        entry = observer.view.watch(uuid4(), f"agent{n:05d}")
        entry.status, entry.last_heartbeat = "ACTIVE", "2026-01-01T00:00:00.000Z"
        entry.master_id = top
        if n == 42:
            entry.status = "INACTIVE"
    return top, observer


def test_vox_watch_draws_ten_thousand_agents_as_their_counts() -> None:
    from rich.console import Console

    from vox_mqtt.cli.looks import Reader
    from vox_mqtt.cli.statusview import status_tree
    from vox_mqtt.protocol.settings import BrokerSettings

    top, observer = big_observer(10_000)
    reader = Reader(
        kind="operator",
        name="operator",
        id=top,
        top=top,
        top_name="operator",
        broker=BrokerSettings(host="127.0.0.1", port=1, username="u", password="p", client_id="c"),
    )
    console = Console(record=True, width=120)
    console.print(status_tree(reader, observer, None, 120))
    text = console.export_text()
    assert "10000 agents, summarised: 1 INACTIVE, 9999 ACTIVE" in text
    assert "agent00042 INACTIVE (site this site)" in text
    assert "agent00043" not in text  # no row per agent
    assert len(text.splitlines()) < 10
    console = Console(record=True, width=120)
    console.print(status_tree(reader, observer, None, 120, unknown_since="12:00:00"))
    assert "10000 agents, every one unknown since 12:00:00" in console.export_text()


def test_the_web_tree_gets_the_summary_only_above_the_threshold() -> None:
    from vox_mqtt.console.web_state import WebState

    top, observer = big_observer(1_001)
    state = WebState(observer, top=top, top_name="operator")
    summary = state.snapshot()["summary"]
    assert summary["total"] == 1_001
    assert summary["states"] == [["INACTIVE", 1], ["ACTIVE", 1_000]]
    ((name, what, site, ref),) = summary["unhealthy"]
    assert (name, what, site) == ("agent00042", "INACTIVE", "this site")
    assert observer.view.get(UUID(ref)).name == "agent00042"  # the page links it by its id
    assert state.summary(above=2_000) is None
    small_top, small = big_observer(10)
    assert WebState(small, top=small_top, top_name="operator").snapshot()["summary"] is None
