"""The fleet file's consequences: config files, per-agent bundles, diffs, plans, retirement."""
