"""`python -m tests.kits.earlyhup --config FILE`: the daemon, sent a SIGHUP as it reads its config.

That is the moment a `systemctl reload` during start lands in: after main() began, before
the event loop's own handler exists (agent_daemon.daemon.hold_early_reloads).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import agent_daemon.__main__ as daemon_main
from agent_daemon.daemon import Prepared

_prepare = daemon_main.prepare


def prepare_after_a_sighup(path: Path) -> Prepared:
    """Send this process a SIGHUP, then read the config as the daemon does."""
    os.kill(os.getpid(), signal.SIGHUP)
    return _prepare(path)


if __name__ == "__main__":
    daemon_main.prepare = prepare_after_a_sighup
    sys.exit(daemon_main.main(sys.argv[1:]))
