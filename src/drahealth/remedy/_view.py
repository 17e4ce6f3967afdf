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
  with where each comes from, plus the node taint or cordon the controller wrote for a
  device in its node-level modes.

How a pod status entry is resolved to a device is the model's rule (see
:mod:`drahealth.core._cluster`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from drahealth.core import (
    ClusterModel,
    Consumer,
    DeviceFacts,
    DeviceKey,
    Observation,
    decode_devices,
    pod_claim_names,
)
from drahealth.remedy._nodes import node_taints, read_node

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
#: The taint Kubernetes puts on a cordoned node (what a cordon means to the scheduler).
CORDON_TAINT: Final = "node.kubernetes.io/unschedulable"


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


def device_taints(
    rules: Iterable[JSON], slices: Iterable[JSON], nodes: Iterable[JSON] = ()
) -> dict[DeviceKey, list[JSON]]:
    """Taints per device: from DeviceTaintRules and slices, and, where the controller ran
    a node-level mode (no DeviceTaintRule API), the node taint or cordon it wrote for the
    device (source ``node/<name>``; the controller's node annotation says which devices)."""
    model = _model(DeviceTaintRule=rules, ResourceSlice=slices)
    out = {key: [t.as_dict() for t in taints] for key, taints in model.all_taints().items()}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        listed = read_node(node)
        written = node_taints(d for d in listed if d.mode == "node-taint")
        for d in listed:
            since = (
                datetime.datetime.fromtimestamp(d.since, datetime.UTC).isoformat()
                if d.since
                else ""
            )
            if d.mode == "node-taint":
                taint = {"key": d.key, "value": written.get(d.key, ""), "effect": "NoSchedule"}
            else:
                taint = {"key": CORDON_TAINT, "value": "", "effect": "NoSchedule"}
            out.setdefault(d.device, []).append(
                {"source": f"node/{name} ({d.mode})", **taint, "since": since}
            )
    return out
