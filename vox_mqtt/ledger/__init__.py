"""An agent's append-only ledger, its outbox rows and the files kept beside it (docs/ledger.md)."""

from vox_mqtt.ledger.store import VOXAgentMemory

__all__ = ["VOXAgentMemory"]
