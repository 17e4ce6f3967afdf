"""What the API objects say about devices, for the readers that list them.

Owns the whole-cluster functions over API objects (as dicts) that ``drahealth status``
and the dashboard call, each answered by the core's :class:`ClusterModel` built from
the objects given (the remediation controller keeps one model up to date instead):

* :func:`observations`: each device's health, from the node agents' device-health
  records and from pods' ``allocatedResourcesStatus``; the record wins where both
  speak, pods' entries are merged worst-first;
* :func:`device_facts`: driver, pool, device, node and attributes from ResourceSlices;
* :func:`consumers`: the live pods whose allocated claims hold a device;
* :func:`device_taints`: the taints on each device, from DeviceTaintRules (rules that
  select many devices included, as the allocator reads them) and from ResourceSlices,
  with where each comes from.

How a pod status entry is resolved to a device is the model's rule (see
:mod:`drahealth.core._cluster`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from drahealth.core import (
    ClusterModel,
    Consumer,
    DeviceFacts,
    DeviceKey,
    Observation,
    decode_devices,
    pod_claim_names,
)

__all__ = [
    "Consumer",
    "Observation",
    "claims_by_name",
    "consumers",
    "device_facts",
    "device_taints",
    "observations",
    "pod_claim_names",
    "pod_observations",
]

JSON = dict[str, Any]


def _model(**objects: Iterable[JSON]) -> ClusterModel:
    model = ClusterModel()
    for kind, objs in objects.items():
        for obj in objs:
            model.apply(kind, "ADDED", obj)
    return model


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def observations(
    configmaps: Iterable[JSON], pods: Iterable[JSON], claims: Iterable[JSON]
) -> dict[DeviceKey, Observation]:
    """Per device; ``configmaps`` are agents' records (already filtered), later ones win."""
    out = _model(ResourceClaim=claims, Pod=pods).observations()
    for cm in configmaps:
        out.update(decode_devices(cm))
    return out


def claims_by_name(claims: Iterable[JSON]) -> dict[tuple[str, str], JSON]:
    return {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c for c in claims}


def pod_observations(
    pod: JSON, claims: Mapping[tuple[str, str], JSON]
) -> Iterable[tuple[DeviceKey, Observation]]:
    """The devices ``pod``'s status reports on (the worst entry per device)."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    named = [
        claims[(namespace, n)] for n in pod_claim_names(pod).values() if (namespace, n) in claims
    ]
    model = _model(ResourceClaim=named, Pod=[pod])
    key_ns = str(meta.get("namespace") or "")
    return model.pod_observations(key_ns, str(meta.get("name") or "")).items()


def device_facts(slices: Iterable[JSON]) -> dict[DeviceKey, DeviceFacts]:
    return _model(ResourceSlice=slices).all_facts()


def consumers(pods: Iterable[JSON], claims: Iterable[JSON]) -> dict[DeviceKey, list[Consumer]]:
    """Live pods (not ended, not being deleted) per allocated device."""
    return _model(ResourceClaim=claims, Pod=pods).all_consumers()


def device_taints(rules: Iterable[JSON], slices: Iterable[JSON]) -> dict[DeviceKey, list[JSON]]:
    model = _model(DeviceTaintRule=rules, ResourceSlice=slices)
    return {key: [t.as_dict() for t in taints] for key, taints in model.all_taints().items()}
