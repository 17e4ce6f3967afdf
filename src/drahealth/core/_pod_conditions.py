"""How a pod condition is set: upstream's ``UpdatePodCondition``, over JSON dicts.

Owns :func:`with_pod_condition`, shared by the API server's eviction subresource and
the device-taint eviction controller stand-in (both add ``DisruptionTarget`` before a
pod is deleted): a new condition type is appended with ``lastTransitionTime`` ``now``;
an existing one is replaced in place, keeping its ``lastTransitionTime`` while its
``status`` stays the same. The time is passed in. No I/O.
"""

from __future__ import annotations

from typing import Any

__all__ = ["with_pod_condition"]

JSON = dict[str, Any]


def with_pod_condition(status: JSON | None, condition: JSON, now: str) -> tuple[list[JSON], bool]:
    """The pod's conditions with ``condition`` set, and whether anything changed.

    Upstream's ``UpdatePodCondition``: a new type is appended with
    ``lastTransitionTime`` ``now``; an existing one is replaced in place, keeping its
    ``lastTransitionTime`` while its ``status`` stays the same. ``status`` is not
    modified.
    """
    conditions = [dict(c) for c in (status or {}).get("conditions") or [] if isinstance(c, dict)]
    new = {**condition, "lastTransitionTime": now}
    for i, old in enumerate(conditions):
        if old.get("type") != condition.get("type"):
            continue
        if old.get("status") == new.get("status") and old.get("lastTransitionTime"):
            new["lastTransitionTime"] = old["lastTransitionTime"]
        changed = any(
            old.get(k) != new.get(k)
            for k in ("status", "reason", "message", "lastProbeTime", "lastTransitionTime")
        )
        conditions[i] = new
        return conditions, changed
    return [*conditions, new], True
