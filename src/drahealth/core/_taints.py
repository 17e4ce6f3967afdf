"""Device taint rules of KEP-5055 as plain functions over API objects (dicts).

Owns :class:`Taint`, :func:`tolerated` (do DeviceTolerations tolerate a taint),
:func:`request_tolerations` (the tolerations of one request of a ResourceClaim, including
``firstAvailable`` subrequests ``<request>/<sub>``) and :func:`selects` (does a
DeviceTaintRule's ``deviceSelector`` select a device: every field given must match, a
missing or empty field matches anything) and :func:`eviction_due` (when a NoExecute
taint makes a pod leave, ``tolerationSeconds`` honoured). Shared by the control plane's
stand-ins, the cluster read model and the remediation controller so all read taints
the same way. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NOW",
    "Taint",
    "eviction_due",
    "request_tolerations",
    "selector_scope",
    "selects",
    "tolerated",
]

#: :func:`eviction_due`'s answer for "at once".
NOW = float("-inf")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


def tolerated(taint: Taint, tolerations: Iterable[Any]) -> bool:
    """Whether ``tolerations`` (DeviceToleration dicts) tolerate ``taint``."""
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        if t.get("effect") and t.get("effect") != taint.effect:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.key:
                return True
        elif t.get("key") == taint.key and str(t.get("value") or "") == taint.value:
            return True
    return False


def request_tolerations(claim: Mapping[str, Any], request: str) -> list[Any]:
    """The tolerations of ``request`` (``<name>`` or ``<name>/<sub>``) in ``claim``."""
    top, _, sub = request.partition("/")
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(req, dict) or req.get("name") != top:
            continue
        if sub:
            for s in req.get("firstAvailable") or []:
                if isinstance(s, dict) and s.get("name") == sub:
                    return list(s.get("tolerations") or [])
        return list((req.get("exactly") or {}).get("tolerations") or [])
    return []


def selects(selector: Mapping[str, Any] | None, driver: str, pool: str, device: str) -> bool:
    """Whether a rule's ``deviceSelector`` selects the device (``None`` selects nothing)."""
    if selector is None:
        return False
    wanted = (("driver", driver), ("pool", pool), ("device", device))
    return all(selector.get(field) in (None, "", value) for field, value in wanted)


def selector_scope(selector: Mapping[str, Any] | None) -> str:
    """How wide a DeviceTaintRule's ``deviceSelector`` reaches.

    ``"none"`` (nil selector: selects nothing), ``"device"`` (driver, pool and device
    named), ``"pool"``/``"driver"`` (a whole pool or driver), ``"partial"`` (some fields
    without the driver, e.g. a device name in every driver), or ``"all"``: an empty
    selector, which upstream applies to *every* device in the cluster (kubernetes
    #141422: one such rule evicted every pod using a DRA device). A 1.34 alpha selector
    with only ``deviceClassName`` or CEL ``selectors`` counts as ``"all"`` here too:
    from 1.35 on those fields are gone and the rule selects everything.
    """
    if selector is None:
        return "none"
    driver, pool, device = (bool(selector.get(f)) for f in ("driver", "pool", "device"))
    if driver and pool and device:
        return "device"
    if driver and pool:
        return "pool"
    if driver and not device:
        return "driver"
    return "partial" if (pool or device or driver) else "all"


def eviction_due(taint: Taint, tolerations: Iterable[Any], added: float | None) -> float | None:
    """When a pod whose request has ``tolerations`` must leave a device with ``taint``.

    :data:`NOW` when no toleration tolerates it; ``None`` (never) when it is tolerated
    and no tolerating toleration has ``tolerationSeconds``; else ``added`` (the taint's
    ``timeAdded``, unix time) plus the smallest ``tolerationSeconds`` of the tolerating
    tolerations (<= 0: at once), as Kubernetes' taint manager does. ``added`` unknown
    means ``None``: the deadline cannot be placed yet.
    """
    matching = [t for t in tolerations if isinstance(t, dict) and tolerated(taint, [t])]
    if not matching:
        return NOW
    seconds = [
        int(t["tolerationSeconds"]) for t in matching if t.get("tolerationSeconds") is not None
    ]
    if not seconds:
        return None
    if min(seconds) <= 0:
        return NOW
    return None if added is None else added + min(seconds)
