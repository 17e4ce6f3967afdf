"""Argument checks shared by every component (durations given in seconds)."""

from __future__ import annotations

import math

__all__ = ["positive_seconds"]


def positive_seconds(what: str, value: object) -> float:
    """``value`` as float seconds; ValueError naming ``what`` unless finite and > 0."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}")
