"""The suite's own order (tests/conftest.py RUN_FIRST) names modules that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import RUN_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_run_first_exists_and_is_named_once() -> None:
    missing = [module for module in RUN_FIRST if not (ROOT / module).is_file()]
    assert missing == [], f"RUN_FIRST names modules that are gone: {missing}"
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)
