"""The ledger under the seed's module name: `from vox_mqtt.memory import VOXAgentMemory`."""

from vox_mqtt.ledger.store import (
    DONE_ACTIONS,
    GENESIS_HASH,
    STARTED_ACTIONS,
    LedgerSync,
    VerifyReport,
    VOXAgentMemory,
)

__all__ = [
    "DONE_ACTIONS",
    "GENESIS_HASH",
    "STARTED_ACTIONS",
    "LedgerSync",
    "VOXAgentMemory",
    "VerifyReport",
]
