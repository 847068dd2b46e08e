"""Which ways of reloading a TLS broker would SIGHUP it (docs/broker.md, "SIGHUP and TLS").

Mosquitto 2.0 crashes some time after a SIGHUP on a listener that takes certificates as
usernames while a persistent session is offline. `vox broker reload` never signals such a
broker; these pure functions decide, from the text of the files a broker host runs with
(the unit, its drop-ins, the logrotate entry), whether anything else on the host would.
`vox broker check DIR` reads the files and prints what they say (docs/security.md, F2).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "LOGROTATE_NAME",
    "effective_exec_reload",
    "logrotate_text",
    "reload_problems",
    "takes_certificates",
]

LOGROTATE_NAME: Final = "logrotate.mosquitto"
DROP_IN_HELP: Final = "install systemd/mosquitto.service.d/vox.conf (docs/deploy.md)"
# Settings by which a listener takes a client certificate's name as its username.
_CERT_AS_USERNAME: Final = frozenset({"use_identity_as_username", "use_subject_as_username"})
# A shell line that sends SIGHUP: kill/killall/pkill with -HUP, -1, -s HUP or --signal HUP.
_HUP: Final = re.compile(
    r"\b(?:kill|killall|pkill|systemctl\s+kill)\b[^\n;|&]*?"
    r"(?:-HUP\b|-SIGHUP\b|-1\b|-s\s*(?:SIG)?HUP\b|--signal[=\s]+(?:SIG)?HUP\b)",
    re.IGNORECASE,
)
# A shell line that asks the service manager to reload mosquitto (its ExecReload runs).
_RELOAD: Final = re.compile(
    r"\b(?:invoke-rc\.d\s+mosquitto\s+reload|systemctl\s+(?:try-)?reload(?:-or-restart)?\s+"
    r"mosquitto|service\s+mosquitto\s+reload)\b"
)


def takes_certificates(conf_text: str) -> bool:
    """Tell whether a mosquitto.conf has a listener that takes certificates as usernames."""
    for line in conf_text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in _CERT_AS_USERNAME and value.strip().lower() == "true":
            return True
    return False


def effective_exec_reload(unit_texts: Iterable[str]) -> list[str]:
    """Return the ExecReload command lines systemd runs, from the unit then its drop-ins.

    As systemd reads them: each `ExecReload=` adds a command, an empty one clears those
    read before it (the drop-in's `ExecReload=` line removes the unit's `kill -HUP`).
    """
    commands: list[str] = []
    for text in unit_texts:
        for raw in text.splitlines():
            line = raw.strip()
            if not line.startswith("ExecReload="):
                continue
            value = line.removeprefix("ExecReload=").strip()
            if value:
                commands.append(value)
            else:
                commands.clear()
    return commands


def _safe_reload(command: str, broker_dir: Path) -> str | None:
    """Return why one ExecReload command line may SIGHUP this broker, or None if it cannot."""
    try:
        words = shlex.split(command.lstrip("@-:+!"))
    except ValueError:
        return f"ExecReload={command}: cannot read the command line"
    if _HUP.search(command):
        return f"ExecReload={command} sends SIGHUP"
    names = [Path(w).name for w in words[:1]]
    if names != ["vox"] or words[1:3] != ["broker", "reload"]:
        return f"ExecReload={command} is not `vox broker reload`"
    if "--tls-sighup" in words:
        return f"ExecReload={command} signals a TLS broker anyway (--tls-sighup)"
    if len(words) < 4 or Path(words[3]) != broker_dir:
        named = words[3] if len(words) > 3 else "no directory"
        return f"ExecReload={command} reloads {named}, not {broker_dir}"
    return None


def reload_problems(
    *,
    conf_text: str,
    broker_dir: Path,
    unit_texts: Sequence[str],
    logrotate: str | None,
) -> list[str]:
    """Return every way this host would SIGHUP a TLS broker, one line each; [] if none.

    conf_text: the broker's mosquitto.conf; unit_texts: mosquitto.service then its drop-ins
    in the order systemd reads them ([] when the host has no such unit); logrotate: the
    text of /etc/logrotate.d/mosquitto, or None when there is none. A broker without a
    listener that takes certificates as usernames is signalled safely: no problem.
    """
    if not takes_certificates(conf_text):
        return []
    problems = []
    safe_reload = True
    if unit_texts:
        commands = effective_exec_reload(unit_texts)
        for command in commands:
            why = _safe_reload(command, broker_dir)
            if why is not None:
                safe_reload = False
                problems.append(
                    f"`systemctl reload mosquitto` would SIGHUP this TLS broker: {why}; "
                    f"{DROP_IN_HELP}"
                )
    if logrotate is not None:
        if _HUP.search(_postrotate(logrotate)):
            problems.append(
                "logrotate's mosquitto entry sends SIGHUP after a rotation: install "
                f"{broker_dir / LOGROTATE_NAME} (copytruncate, no signal) as "
                "/etc/logrotate.d/mosquitto"
            )
        elif _RELOAD.search(_postrotate(logrotate)) and not safe_reload:
            problems.append(
                "logrotate's mosquitto entry runs `reload` after a rotation, which signals "
                f"this broker (above): install {broker_dir / LOGROTATE_NAME} as "
                "/etc/logrotate.d/mosquitto"
            )
    return problems


def _postrotate(text: str) -> str:
    """Return the script lines of every postrotate/prerotate/firstaction/lastaction block."""
    scripts, inside = [], False
    for raw in text.splitlines():
        word = raw.strip()
        if word in ("postrotate", "prerotate", "firstaction", "lastaction"):
            inside = True
        elif word == "endscript":
            inside = False
        elif inside:
            scripts.append(word)
    return "\n".join(scripts)


def logrotate_text(log_files: Sequence[str] = ("/var/log/mosquitto/mosquitto.log",)) -> str:
    """Return a logrotate entry for the broker's log files that never signals the broker.

    Mosquitto keeps its log file open; `copytruncate` copies and empties it in place, so
    the broker needs no SIGHUP to reopen it (the few lines written during the copy may be
    lost). The rendered mosquitto.conf logs to stderr (the journal); this entry replaces
    Debian's, whose postrotate runs `reload`: a SIGHUP without the drop-in.
    """
    files = " ".join(log_files)
    return (
        "# Rendered by `vox broker render` for a TLS broker: install as\n"
        "# /etc/logrotate.d/mosquitto. It rotates without signalling the broker: Mosquitto 2.0\n"
        "# crashes after a SIGHUP on a TLS listener (docs/broker.md, SIGHUP and TLS).\n"
        f"{files} {{\n"
        "\trotate 7\n"
        "\tdaily\n"
        "\tcompress\n"
        "\tsize 100k\n"
        "\tmissingok\n"
        "\tnotifempty\n"
        "\tcopytruncate\n"
        "}\n"
    )
