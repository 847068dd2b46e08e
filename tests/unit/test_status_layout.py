"""`vox status` and `vox watch` at every width: the pure layout, as snapshots (issue 39).

A fleet with long names: at 80 columns every agent still shows its name, state, age, open
incidents and commands (or their count); other columns join whole while they fit, never
blank; `--wide` shows them all. tests/integration/test_operator_views.py runs it for real.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest

from vox_mqtt.cli.statuslayout import COLUMNS, ESSENTIAL, cut, fit_parts, layout_status
from vox_mqtt.cli.statusview import link_banner, status_lines, watch_label
from vox_mqtt.observe.status import ACTIVE, INACTIVE, AgentLiveness

ROWS: list[dict[str, str]] = [
    {
        "name": "root",
        "state": "ACTIVE",
        "code": "-",
        "age": "0.4s ago",
        "incidents": "-",
        "in_flight": "1 delegated",
        "epoch": "3",
        "rate": "2.5",
        "errors": "0",
        "p50": "0.5ms",
        "cpu": "0.3",
        "rss": "54 MiB",
        "host_cpu": "12",
        "host_mem": "41",
        "disk": "23",
        "id": "9945e0d1-168c-4d32-818d-45203ae85b13",
        "commands": "analyze, financial_summary",
        "note": "-",
    },
    {
        "name": "coordinator_for_the_northern_region_of_the_fleet",
        "state": "ACTIVE",
        "code": "-",
        "age": "1.2s ago",
        "incidents": "2",
        "in_flight": "1 delegated",
        "epoch": "1",
        "rate": "1.0",
        "errors": "0",
        "p50": "-",
        "cpu": "1.0",
        "rss": "53 MiB",
        "host_cpu": "12",
        "host_mem": "41",
        "disk": "23",
        "id": "38a04c9c-1556-41fc-a765-8cc91d8cddff",
        "commands": "analyze",
        "note": "-",
    },
    {
        "name": "specialist_analyst_with_a_rather_long_name_a",
        "state": "INACTIVE",
        "code": "VM_CONNECTION_LOST",
        "age": "down 5m 12s",
        "incidents": "1",
        "in_flight": "-",
        "epoch": "4",
        "rate": "-",
        "errors": "-",
        "p50": "-",
        "cpu": "-",
        "rss": "-",
        "host_cpu": "-",
        "host_mem": "-",
        "disk": "-",
        "id": "9ea051fb-685e-40ca-8986-4e80a53aeee4",
        "commands": "-",
        "note": "-",
    },
    {
        "name": "specialist_analyst_with_a_rather_long_name_b",
        "state": "REJECTED",
        "code": "-",
        "age": "0.9s ago",
        "incidents": "-",
        "in_flight": "-",
        "epoch": "2",
        "rate": "-",
        "errors": "-",
        "p50": "-",
        "cpu": "-",
        "rss": "-",
        "host_cpu": "-",
        "host_mem": "-",
        "disk": "-",
        "id": "bb259f8b-d27e-44f9-8508-35ff47709002",
        "commands": "analyze",
        "note": "refused: metrics.cpu_percent: a huge integer is out of bounds (last ACTIVE)",
    },
]

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize(
    ("width", "snapshot"),
    [(80, "status-80.txt"), (120, "status-120.txt"), (None, "status-wide.txt")],
)
def test_status_snapshots(width: int | None, snapshot: str) -> None:
    # COLUMNS=80 vox status, COLUMNS=120 vox status, vox status --wide (tests/unit/snapshots/).
    expected = (SNAPSHOTS / snapshot).read_text(encoding="utf-8").splitlines()
    assert layout_status(ROWS, width).lines() == expected


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160, 200, 300])
def test_every_width_keeps_every_agent_and_the_essential_columns_whole(width: int) -> None:
    laid = layout_status(ROWS, width)
    keys = [c.key for c in laid.columns]
    assert set(keys) >= ESSENTIAL
    assert len(laid.rows) == len(ROWS)
    # Within the width, and a column shown is never blank: some row has a value in it.
    assert all(len(line) <= width for line in laid.lines())
    for index, key in enumerate(keys):
        if key not in ESSENTIAL:
            assert any(row[index] != "-" for row in laid.rows), key
    # Columns keep their order, whichever are shown.
    order = [c.key for c in COLUMNS]
    assert keys == sorted(keys, key=order.index)


def test_wide_shows_every_column_whole() -> None:
    laid = layout_status(ROWS, None)
    assert [c.key for c in laid.columns] == [c.key for c in COLUMNS]
    assert "specialist_analyst_with_a_rather_long_name_b" in laid.lines()[-1]
    assert "(last ACTIVE)" in laid.lines()[-1]


def test_a_terminal_too_narrow_for_the_essentials_cuts_names_not_agents() -> None:
    laid = layout_status(ROWS, 40)
    assert [c.key for c in laid.columns] == ["name", "state", "age", "incidents", "commands"]
    assert [row[0] for row in laid.rows] == ["root", "coordi…fleet", "specia…ame_a", "specia…ame_b"]


def test_cut_keeps_both_ends_and_counts_cells() -> None:
    assert cut("specialist_a", 20) == "specialist_a"
    assert cut("specialist_analyst_a", 9) == "spec…st_a"
    assert cut("日本語の名前", 7) == "日…前"  # two cells each: never more than 7
    assert cut("abc", 1) == "…"


def test_fit_parts_keeps_whole_parts_that_fit() -> None:
    parts = ["heartbeat 1.0s ago", "epoch 3", "id: x"]
    assert fit_parts("spec_a ACTIVE", parts, 50) == (
        "spec_a ACTIVE",
        " (heartbeat 1.0s ago, epoch 3, id: x)",
    )
    assert fit_parts("spec_a ACTIVE", parts, 40) == ("spec_a ACTIVE", " (heartbeat 1.0s ago)")
    # A part that does not fit whole is left out; a later, shorter one may still join.
    assert fit_parts("spec_a ACTIVE", parts, 30) == ("spec_a ACTIVE", " (epoch 3, id: x)")
    assert fit_parts("a_very_long_agent_name ACTIVE", ["epoch 3"], 12) == ("a_very…CTIVE", "")
    assert fit_parts("x", ["a", "b"], None) == ("x", " (a, b)")


NOW = 1000.0


def agent(name: str, status: str, *commands: str, age: float = 1.0) -> AgentLiveness:
    return AgentLiveness(
        id=UUID(int=len(name)),
        name=name,
        status=status,
        epoch=1,
        heartbeat_interval=1.0,
        commands=commands,
        last_heartbeat=datetime.now(UTC).isoformat(),
        received_at=NOW - age,
        error_code=None if status == ACTIVE else "VM_CONNECTION_LOST",
    )


def test_status_lines_from_the_fleet_view_at_80_columns() -> None:
    fleet = [
        agent("root", ACTIVE, "analyze", "financial_summary", age=0.4),
        agent("coordinator_for_the_northern_region_of_the_fleet", ACTIVE, "analyze"),
        agent("specialist_analyst_with_a_rather_long_name_a", INACTIVE, age=12.0),
    ]
    lines = [line.plain for line in status_lines(fleet, [], 80, now=NOW)]
    assert lines == [
        "name                                 state     age         incidents  commands",
        "coordinator_for_t…gion_of_the_fleet  ACTIVE    1.0s ago            -  1 command",
        "root                                 ACTIVE    0.4s ago            -  2 commands",
        "specialist_analys…ather_long_name_a  INACTIVE  down 12.0s          -  -",
    ]


def test_watch_label_fits_its_room_and_says_unknown_when_the_link_is_down() -> None:
    entry = agent("specialist_analyst_with_a_rather_long_name_a", ACTIVE, "analyze")
    colour, head, tail = watch_label(entry, [], NOW, 72)
    assert colour == "green"
    assert head == "specialist_analyst_with_a_rather_long_name_a ACTIVE"
    assert len(head + tail) <= 72
    assert tail == " (heartbeat 1.0s ago)"
    colour, head, tail = watch_label(entry, [], NOW, 72, unknown_since="18:30:05")
    assert (colour, head, tail) == (
        "dim",
        "specialist_analyst_with_a_rather_long_name_a unknown since 18:30:05",
        "",
    )


def test_the_link_banner_says_since_when_nothing_is_known() -> None:
    assert link_banner("18:30:05") == (
        "broker link down since 18:30:05, retrying: every agent unknown since 18:30:05"
    )
