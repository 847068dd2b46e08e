"""tests/unit: no broker, no subprocess, no network (docs/architecture.md, the tests).

A unit test that starts a process or opens a TCP connection fails at that call: an audit
hook (PEP 578) refuses it while a test of this folder runs. Integration tests that share the
process with them (pytest-xdist) are not affected.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

_REFUSED = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system"}
_unit_test_running = False


def _refuse_outside_world(event: str, args: tuple[Any, ...]) -> None:
    if not _unit_test_running:
        return
    if event in _REFUSED or (event == "socket.connect" and isinstance(args[1], tuple)):
        raise RuntimeError(
            f"a unit test may not use {event} {args!r:.120}: move it to tests/integration"
        )


sys.addaudithook(_refuse_outside_world)


@pytest.fixture(autouse=True)
def _no_outside_world() -> Iterator[None]:
    global _unit_test_running
    _unit_test_running = True
    try:
        yield
    finally:
        _unit_test_running = False
