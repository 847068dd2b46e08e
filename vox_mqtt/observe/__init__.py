"""What anyone watching the fleet reads: statuses, war-room incidents, metrics snapshots.

Shared by the agent core (a master watches its children) and the operator's tools
(`vox status`, `vox watch`, `vox exporter`); imports only the contract and the transport.
"""
