"""Checks of role settings shared by the example's roles."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def positive_seconds(settings: Mapping[str, Any], key: str, default: float) -> float:
    """Return a setting that must be a positive number of seconds; ValueError otherwise."""
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"setting {key} must be a positive number of seconds, not {value!r}")
    return float(value)
