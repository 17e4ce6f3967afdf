"""Kubernetes timestamps as text: ``metav1.Time`` and ``metav1.MicroTime``.

Owns the one spelling of the RFC 3339 forms the API uses: whole seconds in UTC with a
``Z`` (``2026-11-24T22:01:05Z``, every ``...Timestamp``, ``lastTransitionTime`` and
``timeAdded``) and microseconds (``2026-11-24T22:01:05.123456Z``, Lease times). A naive
datetime means UTC; an aware one is shown in UTC.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["now_rfc3339", "now_rfc3339_micro", "rfc3339", "rfc3339_micro"]


def _utc(when: dt.datetime) -> dt.datetime:
    if when.tzinfo is None:
        return when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC)


def rfc3339(when: dt.datetime) -> str:
    """``when`` as a ``metav1.Time``: whole seconds (cut, not rounded), UTC, ``Z``."""
    return _utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(when: dt.datetime) -> str:
    """``when`` as a ``metav1.MicroTime``: six fraction digits, UTC, ``Z``."""
    return _utc(when).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    """The wall clock now, as a ``metav1.Time``."""
    return rfc3339(dt.datetime.now(dt.UTC))


def now_rfc3339_micro() -> str:
    """The wall clock now, as a ``metav1.MicroTime``."""
    return rfc3339_micro(dt.datetime.now(dt.UTC))
