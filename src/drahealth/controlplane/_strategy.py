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
import random
import uuid
from typing import Any

from drahealth.core import KubeProfile

from ._batch import default_job
from ._resources import ResourceType
from ._validate import canonical_times

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


#: Kinds with a ``spec`` whose real strategy leaves ``metadata.generation`` unset.
_NO_GENERATION = frozenset({
    ("", "Namespace"), ("", "Node"), ("coordination.k8s.io", "Lease"),
    ("resource.k8s.io", "ResourceClaim"), ("resource.k8s.io", "ResourceClaimTemplate"),
})  # fmt: skip


def _tracks_generation(rt: ResourceType) -> bool:
    """Kinds with a ``spec`` carry ``metadata.generation`` (ConfigMaps and Events do not,
    nor the few kinds whose upstream strategy never sets it)."""
    return "spec" in rt.model.__struct_fields__ and (rt.group, rt.kind) not in _NO_GENERATION


def _status_on_create(rt: ResourceType, obj: JSON) -> None:
    if rt.kind == "Pod" and rt.group == "":
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
    elif rt.kind == "Namespace" and rt.group == "":
        obj["status"] = {"phase": "Active"}
        spec = obj.setdefault("spec", {})
        finalizers = spec.get("finalizers") if isinstance(spec, dict) else None
        if isinstance(spec, dict) and "kubernetes" not in (finalizers or []):
            spec["finalizers"] = [*(finalizers or []), "kubernetes"]
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
    fill_zero_fields(rt, obj)
    if (rt.group, rt.kind) == ("", "Pod"):
        default_pod_spec(obj.get("spec"))
        if old is not None and isinstance(obj.get("spec"), dict):
            admit_pod_tolerations(obj["spec"])
        fill_status_items(obj)
    elif (rt.group, rt.kind) == ("", "Node"):
        fill_status_items(obj)
    elif (rt.group, rt.kind) == ("", "Namespace"):
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str):  # upstream's namespace strategy keeps this label
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    elif rt.group in ("apps", "batch"):
        template = (obj.get("spec") or {}).get("template")
        if isinstance(template, dict):
            default_pod_spec(template.get("spec"))
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


def _pop(obj: Any, key: str) -> bool:
    """Remove ``key`` from the dict ``obj``; whether something was there."""
    return isinstance(obj, dict) and obj.pop(key, None) is not None


def _slice_devices(obj: JSON | None) -> list[JSON]:
    devices = ((obj or {}).get("spec") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


_PER_DEVICE_NODE = ("nodeName", "nodeSelector", "allNodes")
_BINDING = ("bindingConditions", "bindingFailureConditions", "bindsToNode")


def _partitionable_in_use(obj: JSON | None) -> bool:
    spec = (obj or {}).get("spec") or {}
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(
        d.get("consumesCounters") or any(d.get(k) is not None for k in _PER_DEVICE_NODE)
        for d in _slice_devices(obj)
    )


def _binding_in_use(obj: JSON | None) -> bool:
    return any(
        d.get("bindingConditions")
        or d.get("bindingFailureConditions")
        or d.get("bindsToNode") is not None
        for d in _slice_devices(obj)
    )


def _shared_capacity_in_use(obj: JSON | None) -> bool:
    return any(
        d.get("allowMultipleAllocations") is not None
        or any(
            isinstance(c, dict) and c.get("requestPolicy") is not None
            for c in (d.get("capacity") or {}).values()
        )
        for d in _slice_devices(obj)
        if isinstance(d.get("capacity") or {}, dict)
    )


def _drop_slice_fields(new: JSON, old: JSON | None, profile: KubeProfile) -> bool:
    """Upstream's ResourceSlice ``dropDisabledFields``; whether anything was dropped."""
    dropped = False
    spec = new.get("spec")
    devices = _slice_devices(new)
    if not profile.slice_taints and not _slice_taints_in_use(old):
        for dev in devices:
            dropped |= _pop(dev, "taints")
    if not profile.enabled("DRAPartitionableDevices") and not _partitionable_in_use(old):
        dropped |= _pop(spec, "sharedCounters") | _pop(spec, "perDeviceNodeSelection")
        for dev in devices:
            for key in ("consumesCounters", *_PER_DEVICE_NODE):
                dropped |= _pop(dev, key)
    binding = profile.enabled("DRADeviceBindingConditions") and profile.claim_device_status
    if not binding and not _binding_in_use(old):
        for dev in devices:
            for key in _BINDING:
                dropped |= _pop(dev, key)
    if not profile.enabled("DRAConsumableCapacity") and not _shared_capacity_in_use(old):
        for dev in devices:
            dropped |= _pop(dev, "allowMultipleAllocations")
            capacity = dev.get("capacity")
            for cap in capacity.values() if isinstance(capacity, dict) else ():
                dropped |= _pop(cap, "requestPolicy")
    return dropped


def _requests(spec: Any) -> list[JSON]:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    reqs = devices.get("requests") if isinstance(devices, dict) else None
    return [r for r in reqs if isinstance(r, dict)] if isinstance(reqs, list) else []


def _exact_requests(spec: Any) -> list[JSON]:
    """Every ``exactly`` and ``firstAvailable`` entry of a claim spec's requests."""
    out: list[JSON] = []
    for req in _requests(spec):
        if isinstance(req.get("exactly"), dict):
            out.append(req["exactly"])
        subs = req.get("firstAvailable")
        if isinstance(subs, list):
            out.extend(s for s in subs if isinstance(s, dict))
    return out


def _constraints(spec: Any) -> list[JSON]:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    items = devices.get("constraints") if isinstance(devices, dict) else None
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _drop_claim_spec_fields(spec: Any, old_spec: Any, profile: KubeProfile) -> None:
    """Upstream's ``resourceclaimspec.DropDisabledFields`` (1.35 on; 1.34 drops the same
    in each strategy, but no tolerations, and its loop over constraints drops no
    ``distinctAttribute``)."""
    if not isinstance(spec, dict):
        return
    tolerations_in_use = any(e.get("tolerations") for e in _exact_requests(old_spec))
    if profile.minor >= 35 and not profile.slice_taints and not tolerations_in_use:
        for e in _exact_requests(spec):
            e.pop("tolerations", None)
    if not profile.enabled("DRAConsumableCapacity"):
        in_use = any(c.get("distinctAttribute") is not None for c in _constraints(old_spec))
        in_use |= any(e.get("capacity") is not None for e in _exact_requests(old_spec))
        if not in_use:
            if profile.minor >= 35:
                for c in _constraints(spec):
                    c.pop("distinctAttribute", None)
            for e in _exact_requests(spec):
                e.pop("capacity", None)


def _results(status: Any) -> list[JSON]:
    alloc = status.get("allocation") if isinstance(status, dict) else None
    devices = alloc.get("devices") if isinstance(alloc, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def _drop_claim_status_fields(status: JSON, old: JSON | None, profile: KubeProfile) -> None:
    """Upstream's claim status drops for DRAConsumableCapacity and
    DRADeviceBindingConditions (1.34: the latter also needs DRAResourceClaimDeviceStatus
    and takes ``allocationTimestamp`` too)."""
    old_status = (old or {}).get("status")
    old_devices = old_status.get("devices") if isinstance(old_status, dict) else None
    if not profile.enabled("DRAConsumableCapacity"):
        in_use = any(
            r.get("shareID") is not None or r.get("consumedCapacity") is not None
            for r in _results(old_status)
        )
        in_use |= any(
            isinstance(d, dict) and d.get("shareID") is not None for d in old_devices or ()
        )
        old_spec = (old or {}).get("spec")
        in_use |= any(c.get("distinctAttribute") is not None for c in _constraints(old_spec))
        in_use |= any(e.get("capacity") is not None for e in _exact_requests(old_spec))
        if not in_use:
            for r in _results(status):
                r.pop("shareID", None)
                r.pop("consumedCapacity", None)
            for d in status.get("devices") or ():
                if isinstance(d, dict):
                    d.pop("shareID", None)
    binding = profile.enabled("DRADeviceBindingConditions")
    if profile.minor <= 34:
        binding = binding and profile.claim_device_status
    old_alloc = old_status.get("allocation") if isinstance(old_status, dict) else None
    in_use = any(r.get("bindingConditions") or r.get("bindingFailureConditions")
                 for r in _results(old_status))  # fmt: skip
    if profile.minor <= 34:
        in_use |= isinstance(old_alloc, dict) and old_alloc.get("allocationTimestamp") is not None
    if not binding and not in_use:
        alloc = status.get("allocation")
        if profile.minor <= 34 and isinstance(alloc, dict):
            alloc.pop("allocationTimestamp", None)
        for r in _results(status):
            r.pop("bindingConditions", None)
            r.pop("bindingFailureConditions", None)


def drop_disabled_fields(
    rt: ResourceType, new: JSON, old: JSON | None, profile: KubeProfile | None
) -> bool:
    """Remove (in place) the fields ``profile``'s disabled gates take away, as upstream;
    whether a ResourceSlice lost any (its generation counts what was sent).

    A field stays where the old object already used the feature. ResourceSlice:
    ``devices[].taints`` without ``DRADeviceTaints``; ``sharedCounters``,
    ``perDeviceNodeSelection`` and ``devices[].consumesCounters``/``nodeName``/
    ``nodeSelector``/``allNodes`` without ``DRAPartitionableDevices``; binding conditions
    without ``DRADeviceBindingConditions`` (and ``DRAResourceClaimDeviceStatus``);
    ``allowMultipleAllocations`` and capacity ``requestPolicy`` without
    ``DRAConsumableCapacity``. ResourceClaim (and template) spec: request ``tolerations``
    without ``DRADeviceTaints`` (1.35 on), ``capacity`` and constraint
    ``distinctAttribute`` without ``DRAConsumableCapacity``. ResourceClaim status:
    ``devices`` without ``DRAResourceClaimDeviceStatus``
    (``dropDisabledDRAResourceClaimDeviceStatusFields``), the entries of devices an
    update deallocates (``dropDeallocatedStatusDevices``), share ids and consumed
    capacity, binding conditions. Pod ``status.*ContainerStatuses[].allocatedResourcesStatus``
    without ``ResourceHealthStatus`` (``dropDisabledPodStatusFields`` drops it whatever
    the old pod had). ``ResourceHealthStatusMessage`` is the kubelet's gate: the API
    server keeps a ``message`` it is sent. DeviceClass ``spec.extendedResourceName``
    without ``DRAExtendedResource``, unless the old class had one
    (``dropDisabledDRAExtendedResourceFields``).
    """
    if profile is None:
        return False
    if rt.group == "resource.k8s.io" and rt.kind == "ResourceSlice":
        return _drop_slice_fields(new, old, profile)
    if rt.group == "resource.k8s.io" and rt.kind == "ResourceClaim":
        _drop_claim_spec_fields(new.get("spec"), (old or {}).get("spec"), profile)
        # dropDisabledDRAResourceClaimDeviceStatusFields: kept where the old claim had it
        status = new.get("status")
        old_devices = ((old or {}).get("status") or {}).get("devices")
        if not isinstance(status, dict):
            return False
        _drop_claim_status_fields(status, old, profile)
        if not profile.claim_device_status and not old_devices:
            status.pop("devices", None)
        elif old is not None:
            _drop_deallocated_status_devices(status, old)
    elif rt.group == "resource.k8s.io" and rt.kind == "ResourceClaimTemplate":
        spec, old_spec = new.get("spec"), (old or {}).get("spec")
        _drop_claim_spec_fields(
            spec.get("spec") if isinstance(spec, dict) else None,
            old_spec.get("spec") if isinstance(old_spec, dict) else None,
            profile,
        )
    elif rt.group == "resource.k8s.io" and rt.kind == "DeviceClass":
        old_name = ((old or {}).get("spec") or {}).get("extendedResourceName")
        spec = new.get("spec")
        if not profile.enabled("DRAExtendedResource") and not old_name and isinstance(spec, dict):
            spec.pop("extendedResourceName", None)
    elif rt.group == "" and rt.kind == "Pod" and not profile.enabled("ResourceHealthStatus"):
        status = new.get("status")
        if not isinstance(status, dict):
            return False
        for lst in _CONTAINER_STATUSES:
            for cs in status.get(lst) or []:
                if isinstance(cs, dict):
                    cs.pop("allocatedResourcesStatus", None)
    return False


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
    if (rt.group, rt.kind) == ("", "Pod"):
        default_pod_spec(out.get("spec"))
        admit_pod(out)
    _status_on_create(rt, out)
    drop_disabled_fields(rt, out, None, profile)
    _defaults(rt, out, None, now)
    canonical_times(out, rt.model)
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
        sent_uid = (new.get("metadata") or {}).get("uid")
        if sent_uid:  # the uid is checked on a status write too: a changed one is refused
            out["metadata"]["uid"] = sent_uid
        if "managedFields" in (new.get("metadata") or {}):
            out["metadata"]["managedFields"] = new["metadata"]["managedFields"]
        drop_disabled_fields(rt, out, old, profile)
        fill_zero_fields(rt, out)
        if rt.group == "" and rt.kind in ("Pod", "Node"):
            fill_status_items(out)
        canonical_times(out, rt.model)
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
    # a ResourceSlice's generation counts the spec as sent: upstream compares it before
    # dropping the fields of disabled gates
    dropped = drop_disabled_fields(rt, out, old, profile)
    _defaults(rt, out, old, now)
    canonical_times(out, rt.model)
    if _tracks_generation(rt) and (dropped or spec_part(out) != spec_part(old)):
        meta["generation"] = int(old_meta.get("generation") or 1) + 1
    return out


# --------------------------------------------------------------------------- pods

#: Where the ServiceAccount admission mounts the projected token volume.
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: ``utilrand.String``'s alphabet (no vowels, no look-alikes).
_RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def _image_tag(image: str) -> str:
    """The tag ``parsers.ParseImageName`` finds (``latest`` when there is none)."""
    if "@" in image:
        return ""
    last = image.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else "latest"


def _default_probe(probe: Any) -> None:
    if not isinstance(probe, dict):
        return
    for key, value in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1),
                       ("failureThreshold", 3)):  # fmt: skip
        probe.setdefault(key, value)
    http = probe.get("httpGet")
    if isinstance(http, dict):
        http.setdefault("path", "/")
        http.setdefault("scheme", "HTTP")


def _default_container(c: JSON, ephemeral: bool = False) -> None:
    """``SetDefaults_Container`` and what its nested types default."""
    if not c.get("imagePullPolicy"):
        c["imagePullPolicy"] = (
            "Always" if _image_tag(str(c.get("image") or "")) == "latest" else "IfNotPresent"
        )
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if not ephemeral:
        c.setdefault("resources", {})
    resources = c.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, value in resources["limits"].items():
                requests.setdefault(name, value)
    for port in c.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for env in c.get("env") or []:
        ref = (
            ((env or {}).get("valueFrom") or {}).get("fieldRef") if isinstance(env, dict) else None
        )
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")
    for probe in _PROBES:
        _default_probe(c.get(probe))


def _default_volume(v: JSON) -> None:
    for key in ("secret", "configMap", "projected", "downwardAPI"):
        source = v.get(key)
        if isinstance(source, dict):
            source.setdefault("defaultMode", 420)
    if isinstance(v.get("emptyDir"), dict):
        pass
    if isinstance(v.get("hostPath"), dict):
        v["hostPath"].setdefault("type", "")


def default_pod_spec(spec: Any) -> None:
    """``SetDefaults_PodSpec`` and its containers' and volumes' defaults (in place)."""
    if not isinstance(spec, dict):
        return
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    if spec.get("serviceAccountName") and not spec.get("serviceAccount"):
        spec["serviceAccount"] = spec["serviceAccountName"]  # the deprecated alias
    for lst in _CONTAINER_LISTS:
        for c in spec.get(lst) or []:
            if isinstance(c, dict):
                _default_container(c, ephemeral=lst == "ephemeralContainers")
    for v in spec.get("volumes") or []:
        if isinstance(v, dict):
            _default_volume(v)


def admit_pod(obj: JSON) -> None:
    """What the real server's admission chain adds to a new pod (in place): the
    ServiceAccount plugin's account and projected token volume (unless
    ``automountServiceAccountToken`` is false), DefaultTolerationSeconds' not-ready and
    unreachable tolerations, Priority's priority and preemption policy."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = "default"
    spec["serviceAccount"] = spec["serviceAccountName"]
    containers = [
        c for lst in ("initContainers", "containers") for c in spec.get(lst) or []
        if isinstance(c, dict)
    ]  # fmt: skip
    mounted = any(
        isinstance(m, dict) and m.get("mountPath") == SERVICE_ACCOUNT_MOUNT
        for c in containers for m in c.get("volumeMounts") or []
    )  # fmt: skip
    if spec.get("automountServiceAccountToken") is not False and not mounted:
        name = "kube-api-access-" + "".join(random.choices(_RAND_ALPHABET, k=5))
        spec.setdefault("volumes", []).append({
            "name": name,
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ],
                "defaultMode": 420,
            },
        })  # fmt: skip
        for c in containers:
            c.setdefault("volumeMounts", []).append(
                {"name": name, "readOnly": True, "mountPath": SERVICE_ACCOUNT_MOUNT}
            )
    admit_pod_tolerations(spec)
    if spec.get("priority") is None:
        spec["priority"] = _PRIORITY_CLASSES.get(str(spec.get("priorityClassName") or ""), 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")


def admit_pod_tolerations(spec: JSON) -> None:
    """DefaultTolerationSeconds (on create and update): tolerate ``not-ready`` and
    ``unreachable`` NoExecute taints for 300 s unless a toleration covers them."""
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(
            t.get("key") in (key, None, "") and t.get("effect") in ("NoExecute", None, "")
            for t in tolerations
        ):
            spec.setdefault("tolerations", []).append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


#: The priority classes every cluster has (upstream's ``SystemPriorityClasses``).
_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


def qos_class(spec: JSON) -> str:
    """``qos.GetPodQOS``: BestEffort, Guaranteed or Burstable, from cpu/memory."""
    requests: dict[str, list[Any]] = {}
    limits: dict[str, list[Any]] = {}
    containers = [c for lst in ("initContainers", "containers") for c in spec.get(lst) or []]
    guaranteed = True
    for c in containers:
        res = (c or {}).get("resources") or {} if isinstance(c, dict) else {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in req and str(req[name]) not in ("0", "0m"):
                requests.setdefault(name, []).append(req[name])
            if name in lim and str(lim[name]) not in ("0", "0m"):
                limits.setdefault(name, []).append(lim[name])
        names = ("cpu", "memory")
        if not all(n in lim for n in names) or any(
            str(req.get(n, lim[n])) != str(lim[n]) for n in names
        ):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# --------------------------------------------------------------------------- zero fields

#: Fields the real server always writes, because its Go types do not omit them when
#: empty: (group, kind) -> [(path, value)], filled where missing on every write.
_ALWAYS: dict[tuple[str, str], tuple[tuple[tuple[str, ...], Any], ...]] = {
    ("", "Node"): (
        (("spec",), {}),
        (("status", "daemonEndpoints", "kubeletEndpoint", "Port"), 0),
        *(
            (("status", "nodeInfo", k), "")
            for k in ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
                      "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion",
                      "operatingSystem", "architecture")
        ),
    ),
    ("", "Event"): (
        (("involvedObject",), {}), (("source",), {}), (("firstTimestamp",), None),
        (("lastTimestamp",), None), (("eventTime",), None), (("reportingComponent",), ""),
        (("reportingInstance",), ""),
    ),
    ("events.k8s.io", "Event"): (
        (("regarding",), {}), (("deprecatedSource",), {}),
        (("deprecatedFirstTimestamp",), None), (("deprecatedLastTimestamp",), None),
        (("reportingController",), ""), (("reportingInstance",), ""),
    ),
    ("policy", "PodDisruptionBudget"): tuple(
        (("status", k), 0)
        for k in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")
    ),
    ("apps", "ReplicaSet"): ((("status", "replicas"), 0),),
    ("apps", "Deployment"): ((("status",), {}),),
    ("batch", "Job"): ((("status",), {}),),
    ("resource.k8s.io", "ResourceClaim"): ((("status",), {}),),
    ("resource.k8s.io", "DeviceTaintRule"): ((("status",), {}),),
}  # fmt: skip


def fill_zero_fields(rt: ResourceType, obj: JSON) -> None:
    """Add (in place) the empty values the real server's encoding always shows."""
    for path, value in _ALWAYS.get((rt.group, rt.kind), ()):
        node: Any = obj
        for key in path[:-1]:
            if not isinstance(node, dict):
                break
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        else:
            if isinstance(node, dict) and path[-1] not in node:
                node[path[-1]] = copy.deepcopy(value)


#: Per item of a status list, what upstream's encoding always shows.
_CONDITION_ZERO = {"lastProbeTime": None, "lastTransitionTime": None}
_NODE_CONDITION_ZERO = {"lastHeartbeatTime": None, "lastTransitionTime": None}
_CONTAINER_STATUS_ZERO = {
    "state": {}, "lastState": {}, "ready": False, "restartCount": 0, "image": "", "imageID": "",
}  # fmt: skip


def fill_status_items(obj: JSON) -> None:
    """Pod conditions and container statuses, Node conditions: their always-shown fields
    (and a Node's defaulted ``allocatable``)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return
    node = obj.get("kind") == "Node"
    for c in status.get("conditions") or []:
        if isinstance(c, dict):
            for k, v in (_NODE_CONDITION_ZERO if node else _CONDITION_ZERO).items():
                c.setdefault(k, v)
    if node:
        # upstream's SetDefaults_NodeStatus: no allocatable means all of the capacity
        if isinstance(status.get("capacity"), dict) and status.get("allocatable") is None:
            status["allocatable"] = dict(status["capacity"])
        return
    for lst in _CONTAINER_STATUSES:
        for cs in status.get(lst) or []:
            if isinstance(cs, dict):
                for k, v in _CONTAINER_STATUS_ZERO.items():
                    cs.setdefault(k, copy.deepcopy(v))
