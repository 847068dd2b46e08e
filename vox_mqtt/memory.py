"""The ledger under the seed's module name: `from vox_mqtt.memory import VOXAgentMemory`."""

from .ledger import DONE_ACTIONS, GENESIS_HASH, STARTED_ACTIONS, VerifyReport, VOXAgentMemory

__all__ = ["DONE_ACTIONS", "GENESIS_HASH", "STARTED_ACTIONS", "VOXAgentMemory", "VerifyReport"]
