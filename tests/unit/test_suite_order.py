"""The suite's own set-up (tests/conftest.py): its module order, and SIGINT in its processes."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import RUN_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_run_first_exists_and_is_named_once() -> None:
    missing = [module for module in RUN_FIRST if not (ROOT / module).is_file()]
    assert missing == [], f"RUN_FIRST names modules that are gone: {missing}"
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)


def test_the_suite_s_processes_take_sigint_as_a_terminal_would() -> None:
    # Started as a background job by a shell without job control, pytest inherits SIGINT
    # ignored, and so would every `vox` a test interrupts (tests/conftest.py undoes it).
    assert signal.getsignal(signal.SIGINT) != signal.SIG_IGN
