"""The ledger under the seed's module name: `from vox_mqtt.memory import VOXAgentMemory`."""

from vox_mqtt.ledger.actions import DONE_ACTIONS, STARTED_ACTIONS, LedgerAction
from vox_mqtt.ledger.store import GENESIS_HASH, LedgerSync, VerifyReport, VOXAgentMemory

__all__ = [
    "DONE_ACTIONS",
    "GENESIS_HASH",
    "STARTED_ACTIONS",
    "LedgerAction",
    "LedgerSync",
    "VOXAgentMemory",
    "VerifyReport",
]
