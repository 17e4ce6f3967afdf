"""Device taint rules of KEP-5055 as plain functions over API objects (dicts).

Owns :class:`Taint`, :func:`tolerated` (do DeviceTolerations tolerate a taint),
:func:`request_tolerations` (the tolerations of one request of a ResourceClaim, including
``firstAvailable`` subrequests ``<request>/<sub>``) and :func:`selects` (does a
DeviceTaintRule's ``deviceSelector`` select a device: every field given must match, a
missing or empty field matches anything). Shared by the control plane's stand-ins and
the remediation controller so both read taints the same way. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Taint", "request_tolerations", "selects", "tolerated"]


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
