"""The VOX contract: errors, the envelope and its payloads, topics, the fleet tree, settings.

Plain data and rules; nothing here imports another part of the package (docs/architecture.md).
"""
