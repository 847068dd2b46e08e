"""`vox-agent --config FILE`: run one agent daemon."""

from __future__ import annotations

import sys


def main() -> int:
    """Run the daemon (implemented with the daemon issue)."""
    print("vox-agent: the daemon is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
