"""Per-kind create/update preparation (the real server's "REST strategies").

Owns what the server sets or keeps on every write: ``uid``, ``creationTimestamp``,
``generation`` (for kinds with a ``spec``: 1 on create, +1 whenever anything
outside ``metadata``/``status`` changes), status reset on create,
status-subresource isolation on update, defaulting of ``timeAdded`` on
DeviceTaintRule and ResourceSlice device taints, the v1 defaults of a new claim's (or
template's) requests (``allocationMode`` ExactCount, ``count`` 1, toleration
``operator`` Equal), and the fields a release drops when
their feature gate is off (upstream's ``dropDisabledFields`` helpers, see
:func:`drop_disabled_fields`). Objects are stored at their kind's storage version.
Pure functions over JSON dicts; inputs are not mutated.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from drahealth.core import KubeProfile

from ._batch import default_job
from ._resources import ResourceType

JSON = dict[str, Any]

_IMMUTABLE_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "name",
    "namespace",
)


def spec_part(obj: JSON) -> JSON:
    """Everything that counts as "spec" for ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _tracks_generation(rt: ResourceType) -> bool:
    """Kinds with a ``spec`` carry ``metadata.generation`` (ConfigMaps and Events do not)."""
    return "spec" in rt.model.__struct_fields__


def _status_on_create(rt: ResourceType, obj: JSON) -> None:
    if rt.kind == "Pod" and rt.group == "":
        obj["status"] = {"phase": "Pending"}
    elif rt.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    elif rt.kind == "Node":
        return
    elif rt.has_status:
        obj.pop("status", None)


def _fill_slice_taints(obj: JSON, old: JSON | None, now: str) -> None:
    old_times: dict[tuple[str, str, str], str] = {}
    for dev in ((old or {}).get("spec") or {}).get("devices") or []:
        for t in dev.get("taints") or []:
            if t.get("timeAdded"):
                old_times[(dev.get("name", ""), t.get("key", ""), t.get("effect", ""))] = t[
                    "timeAdded"
                ]
    for dev in (obj.get("spec") or {}).get("devices") or []:
        if not isinstance(dev, dict):
            continue
        for t in dev.get("taints") or []:
            if isinstance(t, dict) and not t.get("timeAdded"):
                ident = (dev.get("name", ""), t.get("key", ""), t.get("effect", ""))
                t["timeAdded"] = old_times.get(ident, now)


def _fill_rule_taint(obj: JSON, old: JSON | None, now: str) -> None:
    taint = (obj.get("spec") or {}).get("taint")
    if not isinstance(taint, dict):
        return
    old_taint = ((old or {}).get("spec") or {}).get("taint") or {}
    same_effect = old_taint.get("effect") == taint.get("effect")
    if not taint.get("timeAdded"):
        taint["timeAdded"] = old_taint.get("timeAdded") if same_effect and old_taint else now
    elif old and not same_effect and taint.get("timeAdded") == old_taint.get("timeAdded"):
        taint["timeAdded"] = now


def _default_request(req: Any) -> None:
    """``SetDefaults_ExactDeviceRequest``/``SetDefaults_DeviceSubRequest`` (v1): mode
    ExactCount, count 1 when unset or 0, toleration operator Equal."""
    if not isinstance(req, dict):
        return
    if not req.get("allocationMode"):
        req["allocationMode"] = "ExactCount"
    if req["allocationMode"] == "ExactCount" and req.get("count") in (None, 0):
        req["count"] = 1
    for tol in req.get("tolerations") or []:
        if isinstance(tol, dict) and not tol.get("operator"):
            tol["operator"] = "Equal"


def default_device_claim(devices: Any) -> None:
    """Fill (in place) the defaults upstream's v1 defaulting gives a claim's requests."""
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        if isinstance(req.get("exactly"), dict):
            _default_request(req["exactly"])
        for sub in req.get("firstAvailable") or []:
            _default_request(sub)


def _defaults(rt: ResourceType, obj: JSON, old: JSON | None, now: str) -> None:
    if (rt.group, rt.kind) == ("batch", "Job"):
        default_job(obj)
    if rt.group != "resource.k8s.io":
        return
    # defaulting runs on every decoded object (create and update), as upstream's does, so
    # an unchanged re-apply compares equal to what is stored
    if rt.kind == "ResourceClaim":
        default_device_claim((obj.get("spec") or {}).get("devices"))
    elif rt.kind == "ResourceClaimTemplate":
        spec = (obj.get("spec") or {}).get("spec")
        default_device_claim(spec.get("devices") if isinstance(spec, dict) else None)
    elif rt.kind == "DeviceTaintRule":
        _fill_rule_taint(obj, old, now)
    elif rt.kind == "ResourceSlice":
        _fill_slice_taints(obj, old, now)


_CONTAINER_STATUSES = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


def _slice_taints_in_use(obj: JSON | None) -> bool:
    devices = ((obj or {}).get("spec") or {}).get("devices") or []
    return any(isinstance(d, dict) and d.get("taints") for d in devices)


def _shared_ids(status: Any) -> set[tuple[str, str, str, str]]:
    alloc = (status.get("allocation") or {}) if isinstance(status, dict) else {}
    return {
        (
            str(r.get("driver")),
            str(r.get("pool")),
            str(r.get("device")),
            str(r.get("shareID") or ""),
        )
        for r in ((alloc.get("devices") or {}).get("results") or [])
        if isinstance(r, dict)
    }


def _drop_deallocated_status_devices(status: JSON, old: JSON) -> None:
    """Upstream's ``dropDeallocatedStatusDevices``: entries of devices the old claim had
    allocated and the new one no longer has go, so a deallocation clears them."""
    gone = _shared_ids(old.get("status")) - _shared_ids(status)
    devices = status.get("devices")
    if not gone or not isinstance(devices, list):
        return
    kept = [
        d
        for d in devices
        if not isinstance(d, dict)
        or (
            str(d.get("driver")),
            str(d.get("pool")),
            str(d.get("device")),
            str(d.get("shareID") or ""),
        )
        not in gone
    ]
    if kept:
        status["devices"] = kept
    else:
        status.pop("devices", None)


def drop_disabled_fields(
    rt: ResourceType, new: JSON, old: JSON | None, profile: KubeProfile | None
) -> None:
    """Remove (in place) the fields ``profile``'s disabled gates take away, as upstream.

    ResourceSlice ``spec.devices[].taints`` without ``DRADeviceTaints``, unless the old
    slice already had taints (``dropDisabledDRADeviceTaintsFields``); ResourceClaim
    ``status.devices`` without ``DRAResourceClaimDeviceStatus``, unless the old claim
    had entries (``dropDisabledDRAResourceClaimDeviceStatusFields``), and the entries of
    devices an update deallocates (``dropDeallocatedStatusDevices``); Pod
    ``status.*ContainerStatuses[].allocatedResourcesStatus`` without
    ``ResourceHealthStatus`` (``dropDisabledPodStatusFields`` drops it whatever the old
    pod had). ``ResourceHealthStatusMessage`` is the kubelet's gate: the API server
    keeps a ``message`` it is sent.
    """
    if profile is None:
        return
    if rt.group == "resource.k8s.io" and rt.kind == "ResourceSlice":
        if profile.slice_taints or _slice_taints_in_use(old):
            return
        for dev in (new.get("spec") or {}).get("devices") or []:
            if isinstance(dev, dict):
                dev.pop("taints", None)
    elif rt.group == "resource.k8s.io" and rt.kind == "ResourceClaim":
        # dropDisabledDRAResourceClaimDeviceStatusFields: kept where the old claim had it
        status = new.get("status")
        old_devices = ((old or {}).get("status") or {}).get("devices")
        if not isinstance(status, dict):
            return
        if not profile.claim_device_status and not old_devices:
            status.pop("devices", None)
        elif old is not None:
            _drop_deallocated_status_devices(status, old)
    elif rt.group == "" and rt.kind == "Pod" and not profile.enabled("ResourceHealthStatus"):
        status = new.get("status")
        if not isinstance(status, dict):
            return
        for lst in _CONTAINER_STATUSES:
            for cs in status.get(lst) or []:
                if isinstance(cs, dict):
                    cs.pop("allocatedResourcesStatus", None)


def prepare_create(
    rt: ResourceType, obj: JSON, now: str, profile: KubeProfile | None = None
) -> JSON:
    """The object as it will be stored on create (resourceVersion is stamped later)."""
    out = copy.deepcopy(obj)
    out["apiVersion"], out["kind"] = rt.storage_api_version, rt.kind
    meta = out.setdefault("metadata", {})
    for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        meta.pop(k, None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now
    if _tracks_generation(rt):
        meta["generation"] = 1
    else:
        meta.pop("generation", None)
    if not rt.namespaced:
        meta.pop("namespace", None)
    _status_on_create(rt, out)
    drop_disabled_fields(rt, out, None, profile)
    _defaults(rt, out, None, now)
    return out


def prepare_update(
    rt: ResourceType,
    old: JSON,
    new: JSON,
    subresource: str | None,
    now: str,
    profile: KubeProfile | None = None,
) -> JSON:
    """The object as it will be stored on update, with status isolation applied.

    Writes through the main endpoint keep the old ``status`` (for kinds with a status
    subresource); writes through ``/status`` keep everything but ``status``.
    """
    if subresource == "status":
        out = copy.deepcopy(old)
        if "status" in new:
            out["status"] = copy.deepcopy(new["status"])
        else:
            out.pop("status", None)
        out["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get("resourceVersion")
        if "managedFields" in (new.get("metadata") or {}):
            out["metadata"]["managedFields"] = new["metadata"]["managedFields"]
        drop_disabled_fields(rt, out, old, profile)
        return out
    out = copy.deepcopy(new)
    out["apiVersion"], out["kind"] = rt.storage_api_version, rt.kind
    meta = out.setdefault("metadata", {})
    old_meta = old.get("metadata") or {}
    sent_uid = meta.get("uid")
    for k in _IMMUTABLE_META:
        if k in old_meta:
            meta[k] = old_meta[k]
        else:
            meta.pop(k, None)
    if sent_uid:  # a changed uid is refused by validation, as upstream, not dropped
        meta["uid"] = sent_uid
    meta.pop("selfLink", None)
    if rt.has_status:
        if "status" in old:
            out["status"] = copy.deepcopy(old["status"])
        else:
            out.pop("status", None)
    drop_disabled_fields(rt, out, old, profile)
    _defaults(rt, out, old, now)
    if _tracks_generation(rt) and spec_part(out) != spec_part(old):
        meta["generation"] = int(old_meta.get("generation") or 1) + 1
    return out
