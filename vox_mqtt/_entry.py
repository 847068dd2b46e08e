"""The console scripts' entry points (`vox`, `vox-agent` in pyproject.toml).

Ctrl-C at any moment of a command ends it with exit status 130 and never a traceback
(docs/operations.md, "Interrupting a command"): while the command's modules are still being
imported, and again once it has returned, there is nothing of ours to clean up, so SIGINT ends
the process at once; while the command runs, SIGINT raises KeyboardInterrupt, which each
command turns into its orderly stop and 130, except inside an import the command makes as it
runs, which ends at once too (`_interrupt`).

This module imports nothing of the package at load time: `vox_mqtt/__init__.py` resolves its
public names lazily, so this handler is in place before any heavy import starts.
"""

from __future__ import annotations

import signal
import sys

from vox_mqtt import _end_at_once

EXIT_INTERRUPTED = 130


# Between imports or after the command returned: no task, file or session of ours is half
# done, and a KeyboardInterrupt raised then would surface as an import-time or shutdown
# traceback. vox_mqtt/__init__.py, which loads before this module, already installed this
# handler for the console scripts; installing it again here also covers an entry that does
# not go by those names. A shell starts background jobs with SIGINT ignored (and Python then
# installs no handler): such a process is not the one a Ctrl-C is meant for, so it stays
# ignored.
_IGNORED = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
if not _IGNORED:
    signal.signal(signal.SIGINT, _end_at_once)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _importing(frame: object) -> bool:
    """Tell whether the interrupted code runs inside an import (a frame of importlib's)."""
    while frame is not None:
        if getattr(getattr(frame, "f_code", None), "co_filename", "").startswith(
            "<frozen importlib"
        ):
            return True
        frame = getattr(frame, "f_back", None)
    return False


def _interrupt(signum: int, frame: object) -> None:
    """SIGINT while the command runs: KeyboardInterrupt, which the command turns into its
    orderly stop; but inside an import, the end at once.

    A verb loads most of its modules when it runs (docs/architecture.md, "The command
    line"). A KeyboardInterrupt raised inside such an import may land in code called back
    from a C extension (pydantic-core building a model's validator), which reports it as
    "Exception ignored", with a traceback, and goes on: a `vox warroom --follow` then ran
    on (seen in a full run). An import has nothing of the command's half done.
    """
    if _importing(frame):
        _end_at_once(signum, frame)
    raise KeyboardInterrupt


def _run(load: Callable[[], Callable[[], int]]) -> None:
    ignored = _IGNORED
    main = load()
    if not ignored:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        code = main()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    if not ignored:
        signal.signal(signal.SIGINT, _end_at_once)
    sys.exit(code)


def _load_vox() -> Callable[[], int]:
    from vox_mqtt.cli import main

    return main


def _load_vox_agent() -> Callable[[], int]:
    from agent_daemon.__main__ import main

    return main


def vox() -> None:
    """The `vox` command."""
    _run(_load_vox)


def vox_agent() -> None:
    """The `vox-agent` daemon."""
    _run(_load_vox_agent)
