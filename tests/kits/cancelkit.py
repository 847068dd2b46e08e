"""What the cancel verdict tests share: nested status reports and their times."""

from __future__ import annotations

from typing import Any

T0 = "2026-12-07T04:27:48.619+00:00"
T1 = "2026-12-07T04:27:57.102+00:00"


def nested(*parts: dict[str, Any]) -> dict[str, Any]:
    """The root's part first, each next one as `below` of the one before."""
    report: dict[str, Any] = {}
    for part in reversed(parts):
        report = {**part, "below": report} if report else dict(part)
    return report
