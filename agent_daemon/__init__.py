"""The vox-agent process: one agent of the fleet as a systemd service."""
