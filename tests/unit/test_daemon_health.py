"""The daemon's health: the pure assessment, the file it keeps and what `--health` reads."""

from __future__ import annotations

from pathlib import Path

from agent_daemon.health import HEALTH_FILE, assess, read_health, status_line, write_health

BROKER = "127.0.0.1:1883"


def test_connected_with_a_ledger_that_records_is_the_only_healthy_state() -> None:
    ok = assess(phase="serving", connected=True, ledger_failure=None, broker=BROKER)
    assert ok.ok
    assert (ok.state, ok.ledger) == ("connected", "ok")
    cases = [
        assess(phase="serving", connected=True, ledger_failure="disk full", broker=BROKER),
        assess(phase="serving", connected=False, ledger_failure=None, broker=BROKER),
        assess(phase="starting", connected=False, ledger_failure=None, broker=BROKER),
        assess(phase="stopping", connected=True, ledger_failure=None, broker=BROKER),
        assess(phase="stopped", connected=False, ledger_failure=None, broker=BROKER),
    ]
    assert [c.state for c in cases] == [
        "degraded",
        "disconnected",
        "starting",
        "stopping",
        "stopped",
    ]
    assert not any(c.ok for c in cases)
    assert cases[0].ledger == "unavailable: disk full"
    assert "ledger unavailable: disk full" in cases[0].text


def test_the_status_line_starts_with_the_health() -> None:
    degraded = assess(phase="serving", connected=True, ledger_failure="disk full", broker=BROKER)
    line = status_line(degraded, "serving root (…), epoch 3")
    assert line.startswith("degraded: connected to 127.0.0.1:1883, ledger unavailable: disk full")
    assert line.endswith("serving root (…), epoch 3")
    lost = assess(phase="serving", connected=False, ledger_failure=None, broker=BROKER)
    assert status_line(lost, "serving").startswith("disconnected: broker at 127.0.0.1:1883 lost")


def test_the_file_says_healthy_while_fresh_and_not_once_stale(tmp_path: Path) -> None:
    ok = assess(phase="serving", connected=True, ledger_failure=None, broker=BROKER)
    assert write_health(tmp_path, ok, valid_for=10.0, now=1000.0)
    assert read_health(tmp_path, now=1005.0) == (True, "connected to 127.0.0.1:1883, ledger ok")
    healthy, text = read_health(tmp_path, now=1011.0)
    assert not healthy
    assert text.startswith("stale: connected")
    bad = assess(phase="serving", connected=True, ledger_failure="disk full", broker=BROKER)
    write_health(tmp_path, bad, valid_for=10.0, now=1020.0)
    assert read_health(tmp_path, now=1021.0) == (False, bad.text)


def test_a_missing_or_foreign_file_is_unhealthy_with_a_reason(tmp_path: Path) -> None:
    healthy, text = read_health(tmp_path)
    assert not healthy
    assert "no health file" in text
    (tmp_path / HEALTH_FILE).write_text('{"state": "connected", "ok": true}\n')
    healthy, text = read_health(tmp_path)
    assert not healthy
    assert "not a health file the daemon wrote" in text


def test_every_write_has_one_size_so_a_full_disk_can_overwrite_it_in_place(
    tmp_path: Path,
) -> None:
    long = assess(phase="serving", connected=True, ledger_failure="x" * 5000, broker=BROKER)
    short = assess(phase="serving", connected=True, ledger_failure=None, broker=BROKER)
    write_health(tmp_path, long, valid_for=5.0)
    size = (tmp_path / HEALTH_FILE).stat().st_size
    write_health(tmp_path, short, valid_for=5.0)
    assert (tmp_path / HEALTH_FILE).stat().st_size == size == 1024
    # No room for a new file (the temporary's name is taken by a folder): in place.
    (tmp_path / "health.tmp").mkdir()
    assert write_health(tmp_path, long, valid_for=5.0)
    assert read_health(tmp_path)[0] is False
    assert (tmp_path / HEALTH_FILE).stat().st_size == 1024
