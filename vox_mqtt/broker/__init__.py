"""The broker's control plane: ACLs, secrets, PKI, rendering, reloads, dynsec, federation.

It imports nothing of the agent runtime, and the agent runtime nothing of it.
"""
