"""Device health in ``ResourceClaim.status.devices[].conditions``: the one codec.

Owns the convention (KEP-4817, ``status.devices`` GA in Kubernetes 1.37) by which a DRA
driver reports the health of each device it prepared for a claim, and its reading:

* the condition: type :data:`CONDITION_TYPE` (``DeviceHealthy``), status ``True``
  (Healthy), ``False`` (Unhealthy) or ``Unknown``, reason ``Healthy``/``Unhealthy``/
  ``Unknown``, message the health message cut to :data:`CONDITION_MESSAGE_MAX_BYTES`
  (metav1.Condition's limit) without splitting a character, ``observedGeneration`` the
  claim's generation, ``lastTransitionTime`` kept while the status stays the same
  (:func:`health_condition`);
* the entry merge (:func:`merge_device_status`): the entry of ``status.devices`` keyed by
  driver, pool, device and ``shareID`` (upstream's list-map keys) gets the condition;
  its other fields (``data``, ``networkData``) and other conditions stay as they are;
  entries of other devices or drivers are never touched; an entry that already holds
  :data:`MAX_CONDITIONS` conditions of other types is left alone (the server would
  refuse a ninth);
* the reading (:func:`claim_observations`): every entry with a ``DeviceHealthy``
  condition of an allocated device, as an :class:`Observation` with source
  ``claim <namespace>/<name>`` and ``since`` its ``lastTransitionTime``.

Pure functions over dicts; time is passed in as RFC 3339 text. No I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from drahealth.core._cluster_records import Observation
from drahealth.core._health import DeviceKey, Health, truncate_message

__all__ = [
    "CONDITION_MESSAGE_MAX_BYTES",
    "CONDITION_TYPE",
    "MAX_CONDITIONS",
    "claim_node",
    "claim_observations",
    "device_status_entries",
    "health_condition",
    "merge_device_status",
]

JSON = dict[str, Any]

#: The condition type drahealth writes into ``status.devices[].conditions``.
CONDITION_TYPE: Final = "DeviceHealthy"
#: ``metav1.Condition.message`` may hold at most 32 KiB (upstream ``maxMessageLen``).
CONDITION_MESSAGE_MAX_BYTES: Final = 32 * 1024
#: ``AllocatedDeviceStatusMaxConditions``: at most 8 conditions per entry.
MAX_CONDITIONS: Final = 8

_STATUS = {Health.HEALTHY: "True", Health.UNHEALTHY: "False", Health.UNKNOWN: "Unknown"}
_HEALTH = {v: k for k, v in _STATUS.items()}


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _entry_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str | None]:
    share = entry.get("shareID")
    return (
        str(entry.get("driver") or ""),
        str(entry.get("pool") or ""),
        str(entry.get("device") or ""),
        str(share) if share else None,
    )


def health_condition(
    health: Health,
    message: str,
    *,
    generation: int,
    now: str,
    previous: Mapping[str, Any] | None = None,
) -> JSON:
    """The ``DeviceHealthy`` condition for ``health``; ``now`` is RFC 3339 text.

    ``previous`` is the condition as stored: its ``lastTransitionTime`` is kept when the
    status does not change (the metav1 convention), so a new message alone is no
    transition.
    """
    status = _STATUS[health]
    since = now
    if previous is not None and previous.get("status") == status:
        since = str(previous.get("lastTransitionTime") or now)
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "observedGeneration": max(0, int(generation)),
        "lastTransitionTime": since,
        "reason": health.value,
        "message": truncate_message(message, CONDITION_MESSAGE_MAX_BYTES),
    }


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for ``lastTransitionTime`` (kept by :func:`health_condition` anyway)."""
    fields = ("type", "status", "observedGeneration", "reason", "message")
    return all(a.get(f) == b.get(f) for f in fields)


def merge_device_status(
    entries: Sequence[Mapping[str, Any]],
    key: tuple[str, str, str, str | None],
    health: Health,
    message: str,
    *,
    generation: int,
    now: str,
) -> tuple[list[JSON], str]:
    """``status.devices`` with ``key``'s ``DeviceHealthy`` condition set to ``health``.

    ``key`` is (driver, pool, device, shareID or None). Returns the new list and what
    happened: ``"unchanged"`` (the same condition is there), ``"updated"``,
    ``"added"`` (a new entry), or ``"full"`` (the entry holds :data:`MAX_CONDITIONS`
    other conditions; nothing written). The input is not modified.
    """
    out: list[JSON] = [dict(e) for e in entries]
    for i, entry in enumerate(out):
        if _entry_key(entry) != key:
            continue
        conditions = [dict(c) for c in _dicts(entry.get("conditions"))]
        at = next((j for j, c in enumerate(conditions) if c.get("type") == CONDITION_TYPE), None)
        previous = conditions[at] if at is not None else None
        cond = health_condition(health, message, generation=generation, now=now, previous=previous)
        if previous is not None and _same(previous, cond):
            return out, "unchanged"
        if at is None:
            if len(conditions) >= MAX_CONDITIONS:
                return out, "full"
            conditions.append(cond)
        else:
            conditions[at] = cond
        out[i] = {**entry, "conditions": conditions}
        return out, "updated"
    driver, pool, device, share = key
    new: JSON = {"driver": driver, "pool": pool, "device": device}
    if share:
        new["shareID"] = share
    new["conditions"] = [health_condition(health, message, generation=generation, now=now)]
    out.append(new)
    return out, "added"


def device_status_entries(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The claim's ``status.devices`` entries (dicts only)."""
    return _dicts(_dict(claim.get("status")).get("devices"))


def claim_node(claim: Mapping[str, Any]) -> str:
    """The node a claim is allocated on, from the allocation's node selector.

    Upstream's allocator pins a node-local allocation with one term whose
    ``matchFields`` say ``metadata.name In [<node>]``; anything else names no node.
    """
    selector = _dict(_dict(_dict(claim.get("status")).get("allocation")).get("nodeSelector"))
    for term in _dicts(selector.get("nodeSelectorTerms")):
        for req in _dicts(term.get("matchFields")):
            values = req.get("values")
            if (
                req.get("key") == "metadata.name"
                and req.get("operator") == "In"
                and isinstance(values, list)
                and len(values) == 1
            ):
                return str(values[0])
    return ""


def _unix(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def claim_observations(claim: Mapping[str, Any]) -> dict[DeviceKey, Observation]:
    """What the claim's ``DeviceHealthy`` conditions say, per allocated device.

    Only entries naming a device of ``status.allocation`` count (the server refuses
    others; a stale entry of a claim being reallocated is ignored). Several entries for
    one device (several shares) merge worst-first. An unknown condition status reads
    Unknown.
    """
    status = _dict(claim.get("status"))
    allocated = {
        DeviceKey(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
        for r in _dicts(_dict(_dict(status.get("allocation")).get("devices")).get("results"))
    }
    if not allocated:
        return {}
    meta = _dict(claim.get("metadata"))
    source = f"claim {meta.get('namespace') or ''}/{meta.get('name') or ''}"
    node = claim_node(claim)
    out: dict[DeviceKey, Observation] = {}
    for entry in _dicts(status.get("devices")):
        driver, pool, device, _share = _entry_key(entry)
        key = DeviceKey(driver, pool, device)
        if key not in allocated:
            continue
        cond = next(
            (c for c in _dicts(entry.get("conditions")) if c.get("type") == CONDITION_TYPE), None
        )
        if cond is None:
            continue
        health = _HEALTH.get(str(cond.get("status") or ""), Health.UNKNOWN)
        obs = Observation(
            health,
            str(cond.get("message") or ""),
            node,
            source,
            _unix(cond.get("lastTransitionTime")),
        )
        held = out.get(key)
        if held is None or health.severity > held.health.severity:
            out[key] = obs
    return out
