"""Ctrl-C at any moment of a `vox` command: exit 130, at most one line, never a traceback.

The `vox` a person runs is the console script pip writes (`vox_mqtt._entry:vox`), so these
tests run that script, and send SIGINT at moments spread over a command's whole life: while
Python imports the package, while the command waits on the broker, and as it ends
(docs/operations.md, "Interrupting a command").
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kits.brokerkit import SecureBroker
from tests.kits.clikit import configs, secure  # noqa: F401  (fixtures)
from tests.kits.faultkit import REPO

VOX = Path(sys.executable).parent / "vox"
# From the first import to well after the command has connected and is waiting.
MOMENTS = (0.03, 0.08, 0.15, 0.25, 0.4, 0.6, 0.9, 1.3)


def _script_is_ours() -> None:
    text = VOX.read_text()
    assert "vox_mqtt._entry" in text, f"{VOX} predates the entry point: run `make test` again"


def _interrupt(args: list[str], after: float) -> tuple[int, str]:
    """Run `vox ARGS`, send SIGINT `after` seconds in; return its exit status and stderr."""
    process = subprocess.Popen(
        [str(VOX), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"vox {' '.join(args)} did not end within 10 s of SIGINT at {after} s: {err}")
    return process.returncode, err


def _handler_line() -> int:
    """The line of vox_mqtt/__init__.py that installs the SIGINT handler."""
    text = (REPO / "vox_mqtt" / "__init__.py").read_text().splitlines()
    return next(at for at, line in enumerate(text, 1) if "_signal.signal(" in line)


def _before_the_script(err: str) -> bool:
    """Tell whether a traceback comes from before the handler is in place: the interpreter's
    own start (site, the editable install's finder), the `vox` script's import of its entry
    while Python still looks for the package, or the lines of vox_mqtt/__init__.py before
    the one that installs it, its first statements. No handler of any program can be in
    place there; any later moment shows a frame of the package past that line and fails.
    A loaded machine can stretch that start past the earliest moments tried here."""
    lines = err.splitlines()
    frames = [
        (line, lines[at + 1].strip() if at + 1 < len(lines) else "")
        for at, line in enumerate(lines)
        if line.lstrip().startswith('File "')
    ]
    ours = (f"{REPO}/vox_mqtt/", f"{REPO}/agent_daemon/")
    package = f'File "{REPO}/vox_mqtt/__init__.py", line '

    def of_ours(frame: str, statement: str) -> bool:
        if str(VOX) in frame:  # the script: only its import of the entry is before us
            return not statement.startswith("from vox_mqtt._entry import")
        if package in frame:  # the package's first lines, up to the handler's
            return int(frame.split(package)[1].split(",")[0]) > _handler_line()
        return any(mark in frame for mark in ours)

    return bool(frames) and not any(of_ours(frame, statement) for frame, statement in frames)


def _check(args: list[str], after: float, code: int, err: str) -> None:
    where = f"vox {' '.join(args)} interrupted {after} s in"
    if "Traceback" in err and _before_the_script(err):
        return  # the interpreter's own start, not the command (see _before_the_script)
    assert "Traceback" not in err, f"{where} printed a traceback:\n{err}"
    assert len(err.strip().splitlines()) <= 1, f"{where} printed more than one line:\n{err}"
    # Killed by SIGINT before Python set up its own handler is 130 to a shell too.
    assert code in (130, -signal.SIGINT), f"{where} exited {code}:\n{err}"


@pytest.mark.parametrize("after", MOMENTS)
def test_ctrl_c_while_a_verb_starts_or_waits_on_a_broker_never_prints_a_traceback(
    configs: dict[str, Path],  # noqa: F811
    secure: SecureBroker,  # noqa: F811
    after: float,
) -> None:
    _script_is_ours()
    # `vox warroom --follow` runs until interrupted: every moment lands inside the command.
    args = ["warroom", "--config", str(configs["operator"]), "--follow"]
    code, err = _interrupt(args, after)
    _check(args, after, code, err)


def test_ctrl_c_while_importing_help_never_prints_a_traceback() -> None:
    _script_is_ours()
    for after in (0.02, 0.05, 0.1, 0.2, 0.3):
        code, err = _interrupt(["--help"], after)
        if code == 0:
            continue  # the help was printed before the signal came: nothing to interrupt
        _check(["--help"], after, code, err)
