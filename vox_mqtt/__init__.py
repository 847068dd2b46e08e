"""vox-mqtt: hierarchical agents on edge hosts that talk VOX over MQTT.

The public API is resolved on first use (PEP 562): `import vox_mqtt` costs nothing, so a
`vox` verb imports only what it needs (docs/architecture.md, "Layers").
"""

from __future__ import annotations

# The C module under `signal`, loaded by the interpreter's own start: `signal` itself would
# load enum first, a window before the handler below (docs/operations.md, "Interrupting").
import _signal  # type: ignore[import-not-found]
import importlib  # already loaded by the interpreter's own start
import os
import sys


def _end_at_once(signum: int, frame: object) -> None:
    """End a `vox` or `vox-agent` process at once on SIGINT, exit status 130, no traceback.

    Installed by the first code of the package to run when the process is one of the console
    scripts: the script imports `vox_mqtt._entry`, which loads this package first, so a
    Ctrl-C while the package or the entry module loads would otherwise raise
    KeyboardInterrupt inside an import (docs/operations.md, "Interrupting a command").
    vox_mqtt/_entry.py hands SIGINT back to Python while the command runs.
    """
    # Between imports or after the command returned: nothing of ours is half done. Flush
    # what the command printed, then go.
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib would be one more import before the handler)
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


# Only in the console scripts (a library user's program keeps its own SIGINT), and not when a
# shell started the process with SIGINT ignored (a background job, see vox_mqtt/_entry.py).
_SCRIPT = os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".exe")
if _SCRIPT in ("vox", "vox-agent") and _signal.getsignal(_signal.SIGINT) != _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _end_at_once)

from vox_mqtt._version import __version__  # noqa: E402  (after the handler: one load less)

# Not `from typing import TYPE_CHECKING`: importing typing here would put a module load
# between the interpreter's start and the `vox` entry's SIGINT handler (vox_mqtt/_entry.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from vox_mqtt.agent.facade import AgentConfig, VOXAgent
    from vox_mqtt.agent.roles import Role, command, on
    from vox_mqtt.console.operator import OperatorConsole
    from vox_mqtt.ledger.store import VOXAgentMemory
    from vox_mqtt.protocol.errors import (
        BrokerUnavailable,
        CommandFailed,
        ConfigError,
        DeliveryFailed,
        FleetError,
        InvalidMessage,
        LedgerError,
        Refused,
        SubscriptionRefused,
        TopicError,
        VoxError,
    )
    from vox_mqtt.protocol.hierarchy import AgentSpec, AgentView, Fleet, load_fleet, parse_fleet
    from vox_mqtt.protocol.messages import VOXMessage, new_message, parse, serialize
    from vox_mqtt.protocol.topics import WARROOM_ID
    from vox_mqtt.transport.session import BrokerSettings

# Each public name and the module that defines it.
_HOMES = {
    "AgentConfig": "vox_mqtt.agent.facade",
    "VOXAgent": "vox_mqtt.agent.facade",
    "Role": "vox_mqtt.agent.roles",
    "command": "vox_mqtt.agent.roles",
    "on": "vox_mqtt.agent.roles",
    "OperatorConsole": "vox_mqtt.console.operator",
    "VOXAgentMemory": "vox_mqtt.ledger.store",
    "BrokerUnavailable": "vox_mqtt.protocol.errors",
    "CommandFailed": "vox_mqtt.protocol.errors",
    "ConfigError": "vox_mqtt.protocol.errors",
    "DeliveryFailed": "vox_mqtt.protocol.errors",
    "FleetError": "vox_mqtt.protocol.errors",
    "InvalidMessage": "vox_mqtt.protocol.errors",
    "LedgerError": "vox_mqtt.protocol.errors",
    "Refused": "vox_mqtt.protocol.errors",
    "SubscriptionRefused": "vox_mqtt.protocol.errors",
    "TopicError": "vox_mqtt.protocol.errors",
    "VoxError": "vox_mqtt.protocol.errors",
    "AgentSpec": "vox_mqtt.protocol.hierarchy",
    "AgentView": "vox_mqtt.protocol.hierarchy",
    "Fleet": "vox_mqtt.protocol.hierarchy",
    "load_fleet": "vox_mqtt.protocol.hierarchy",
    "parse_fleet": "vox_mqtt.protocol.hierarchy",
    "VOXMessage": "vox_mqtt.protocol.messages",
    "new_message": "vox_mqtt.protocol.messages",
    "parse": "vox_mqtt.protocol.messages",
    "serialize": "vox_mqtt.protocol.messages",
    "WARROOM_ID": "vox_mqtt.protocol.topics",
    "BrokerSettings": "vox_mqtt.transport.session",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'vox_mqtt' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "WARROOM_ID",
    "AgentConfig",
    "AgentSpec",
    "AgentView",
    "BrokerSettings",
    "BrokerUnavailable",
    "CommandFailed",
    "ConfigError",
    "DeliveryFailed",
    "Fleet",
    "FleetError",
    "InvalidMessage",
    "LedgerError",
    "OperatorConsole",
    "Refused",
    "Role",
    "SubscriptionRefused",
    "TopicError",
    "VOXAgent",
    "VOXAgentMemory",
    "VOXMessage",
    "VoxError",
    "__version__",
    "command",
    "load_fleet",
    "new_message",
    "on",
    "parse",
    "parse_fleet",
    "serialize",
]
