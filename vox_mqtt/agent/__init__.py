"""The agent runtime: the `VOXAgent` facade and the parts it composes (docs/architecture.md)."""

from vox_mqtt.agent.facade import AgentConfig, VOXAgent

__all__ = ["AgentConfig", "VOXAgent"]
