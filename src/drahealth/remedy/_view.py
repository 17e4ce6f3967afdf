"""What the remediation controller reads from the API, turned into device facts.

Owns the pure functions over API objects (as dicts) that the controller calls on
every pass:

* :func:`observations`: each device's health, from the node agents' device-health
  ConfigMaps (``drahealth-devices-<node>``: every device of the node, leases applied)
  and from pods' ``allocatedResourcesStatus`` (what any kubelet or agent writes); the
  ConfigMap wins where both speak, pods' entries are merged worst-first;
* :func:`device_facts`: driver, pool, device, node and attributes from ResourceSlices;
* :func:`consumers`: the live pods whose allocated claims hold a device;
* :func:`device_taints`: the taints on each device, from DeviceTaintRules that name one
  device and from ResourceSlices, with where each comes from.

A pod status entry names a claim (``claim:<name>[/<request>]``) and a resourceID; the
device is found among the claim's allocation results for that request: the resourceID
``<driver>/<pool>/<device>`` matches exactly, otherwise (a CDI device ID) the only
candidate, or the one candidate whose device name ends the ID. An entry that stays
ambiguous is skipped rather than guessed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from drahealth.core import DeviceKey, Health
from drahealth.core._policy import AttributeValue, DeviceFacts

__all__ = [
    "Consumer",
    "Observation",
    "consumers",
    "device_facts",
    "device_taints",
    "observations",
    "pod_observations",
]

JSON = dict[str, Any]
_ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Observation:
    health: Health
    message: str
    node: str
    source: str  # "agent" or "pod"
    #: Unix time of the last change, where the source says (the agent's record does).
    since: float | None = None


@dataclass(frozen=True, slots=True, order=True)
class Consumer:
    """A live pod using a device through ``claim`` (its ``request``)."""

    namespace: str
    name: str
    uid: str
    node: str
    claim: str
    request: str


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _health(value: object) -> Health:
    try:
        return Health(str(value))
    except ValueError:
        return Health.UNKNOWN


def observations(
    configmaps: Iterable[JSON], pods: Iterable[JSON], claims: Iterable[JSON]
) -> dict[DeviceKey, Observation]:
    out: dict[DeviceKey, Observation] = {}
    by_name = claims_by_name(claims)
    for obj in pods:
        for key, obs in pod_observations(obj, by_name):
            old = out.get(key)
            if old is None or obs.health.severity > old.health.severity:
                out[key] = obs
    for cm in configmaps:
        node = str((_meta(cm).get("labels") or {}).get("drahealth.io/node", ""))
        try:
            rows = json.loads(((cm.get("data") or {}).get("devices")) or "[]")
        except (TypeError, ValueError):
            continue
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict):
                continue
            driver, pool, device = row.get("driver"), row.get("pool"), row.get("device")
            if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
                continue
            message, since = row.get("message"), row.get("since")
            out[DeviceKey(driver, pool, device)] = Observation(
                _health(row.get("health")),
                message if isinstance(message, str) else "",
                node,
                "agent",
                float(since) if isinstance(since, int | float) else None,
            )
    return out


def claims_by_name(claims: Iterable[JSON]) -> dict[tuple[str, str], JSON]:
    return {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c for c in claims}


def pod_claim_names(pod: JSON) -> dict[str, str]:
    """Pod claim reference name -> ResourceClaim name (direct or from a template)."""
    out: dict[str, str] = {}
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, dict)
    }
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(ref, dict) or not ref.get("name"):
            continue
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if name:
            out[str(ref["name"])] = str(name)
    return out


def _results(claim: JSON) -> list[JSON]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, dict)]


def _for_request(results: list[JSON], request: str) -> list[JSON]:
    if not request:
        return results
    return [
        r
        for r in results
        if r.get("request") == request or str(r.get("request", "")).startswith(request + "/")
    ]


def _resolve(resource_id: str, candidates: list[JSON]) -> JSON | None:
    for r in candidates:
        if resource_id == f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}":
            return r
    if len(candidates) == 1:
        return candidates[0]
    ends = [
        r
        for r in candidates
        if any(resource_id.endswith(sep + str(r.get("device"))) for sep in ("-", "=", "/", "_"))
    ]
    return ends[0] if len(ends) == 1 else None


def pod_observations(
    pod: JSON, claims: Mapping[tuple[str, str], JSON]
) -> Iterable[tuple[DeviceKey, Observation]]:
    """The devices ``pod``'s status reports on, resolved as the module docstring says."""
    meta, status = _meta(pod), pod.get("status") or {}
    namespace = str(meta.get("namespace") or "default")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    names = pod_claim_names(pod)
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for cs in statuses:
        for entry in (cs or {}).get("allocatedResourcesStatus") or []:
            ref, _, request = str(entry.get("name", "")).removeprefix("claim:").partition("/")
            claim = claims.get((namespace, names.get(ref, "")))
            if claim is None:
                continue
            candidates = _for_request(_results(claim), request)
            for res in entry.get("resources") or []:
                r = _resolve(str(res.get("resourceID", "")), candidates)
                if r is None:
                    continue
                key = DeviceKey(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                yield (
                    key,
                    Observation(
                        _health(res.get("health")), str(res.get("message") or ""), node, "pod"
                    ),
                )


def device_facts(slices: Iterable[JSON]) -> dict[DeviceKey, DeviceFacts]:
    out: dict[DeviceKey, DeviceFacts] = {}
    for s in slices:
        spec = s.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        node = str(spec.get("nodeName") or "")
        for device in spec.get("devices") or []:
            if not isinstance(device, dict) or not device.get("name"):
                continue
            attrs: dict[str, AttributeValue] = {}
            for name, value in (device.get("attributes") or {}).items():
                if not isinstance(value, dict):
                    continue
                v = next(
                    (value[k] for k in ("string", "int", "bool", "version") if k in value), None
                )
                if isinstance(v, str | int | bool):
                    attrs[name] = v
                    attrs.setdefault(name.rpartition("/")[2], v)
            key = DeviceKey(driver, pool, str(device["name"]))
            out[key] = DeviceFacts(driver, pool, key.device, node, attrs)
    return out


def consumers(pods: Iterable[JSON], claims: Iterable[JSON]) -> dict[DeviceKey, list[Consumer]]:
    """Live pods (not ended, not being deleted) per allocated device."""
    by_name = claims_by_name(claims)
    out: dict[DeviceKey, list[Consumer]] = {}
    for pod in pods:
        meta = _meta(pod)
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        namespace = str(meta.get("namespace") or "default")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        for claim_name in pod_claim_names(pod).values():
            claim = by_name.get((namespace, claim_name))
            if claim is None:
                continue
            for r in _results(claim):
                key = DeviceKey(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                out.setdefault(key, []).append(
                    Consumer(
                        namespace,
                        str(meta.get("name")),
                        str(meta.get("uid") or ""),
                        node,
                        claim_name,
                        str(r.get("request") or ""),
                    )
                )
    return out


def device_taints(rules: Iterable[JSON], slices: Iterable[JSON]) -> dict[DeviceKey, list[JSON]]:
    out: dict[DeviceKey, list[JSON]] = {}
    for rule in rules:
        spec = rule.get("spec") or {}
        sel, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
        if not (sel.get("driver") and sel.get("pool") and sel.get("device")):
            continue  # a rule for many devices is listed by `kubectl get devicetaintrules`
        key = DeviceKey(sel["driver"], sel["pool"], sel["device"])
        out.setdefault(key, []).append(
            {
                "source": f"devicetaintrule/{(rule.get('metadata') or {}).get('name')}",
                "key": taint.get("key", ""),
                "value": taint.get("value", ""),
                "effect": taint.get("effect", ""),
                "since": taint.get("timeAdded", ""),
            }
        )
    for s in slices:
        spec = s.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name", "")
        for d in spec.get("devices") or []:
            for taint in d.get("taints") or []:
                key = DeviceKey(spec.get("driver", ""), pool, d.get("name", ""))
                out.setdefault(key, []).append(
                    {
                        "source": f"resourceslice/{(s.get('metadata') or {}).get('name')}",
                        "key": taint.get("key", ""),
                        "value": taint.get("value", ""),
                        "effect": taint.get("effect", ""),
                        "since": taint.get("timeAdded", ""),
                    }
                )
    return out
