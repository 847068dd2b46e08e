"""The operator's home: one resident console process that every `vox` verb is a client of.

`vox console serve` owns the operator's MQTT session, ledger, inbox and keys, and serves
one HTTP API on a Unix socket in the operator's state dir (and, with `--web`, the web
console on TCP). docs/architecture.md, "The operator's console".
"""
