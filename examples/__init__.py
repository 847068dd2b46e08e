"""Example applications built on vox_mqtt; `freelance` is contract v1's (seed 003)."""
