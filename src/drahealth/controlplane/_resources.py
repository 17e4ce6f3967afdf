"""The kinds the embedded API server serves, and the discovery documents built from them.

Owns the kind registry (``ResourceType``: group, version, plural, scope, short names,
subresources, the lightkube model used for decode-validation, supported field
selectors, strategic-merge keys) and the plain and aggregated (apidiscovery v2)
discovery bodies. Knows nothing of HTTP or storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from lightkube.models import (
    apps_v1,
    coordination_v1,
    core_v1,
    events_v1,
    policy_v1,
    resource_v1,
)

JSON = dict[str, Any]
Path = tuple[str, ...]

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]

# Strategic-merge / server-side-apply list keys, by field path (list indices left out).
COMMON_MERGE_KEYS: dict[Path, str] = {
    ("metadata", "ownerReferences"): "uid",
    ("status", "conditions"): "type",
}
PRIMITIVE_MERGE_LISTS: frozenset[Path] = frozenset({("metadata", "finalizers")})

_CONTAINER_KEYS: dict[Path, str] = {
    ("env",): "name",
    ("ports",): "containerPort",
    ("volumeMounts",): "mountPath",
    ("volumeDevices",): "devicePath",
    ("resizePolicy",): "resourceName",
}


def _pod_merge_keys() -> dict[Path, str]:
    keys: dict[Path, str] = {
        ("spec", "volumes"): "name",
        ("spec", "resourceClaims"): "name",
        ("spec", "imagePullSecrets"): "name",
        ("status", "podIPs"): "ip",
        ("status", "hostIPs"): "ip",
        ("status", "resourceClaimStatuses"): "name",
    }
    for lst in ("containers", "initContainers", "ephemeralContainers"):
        keys[("spec", lst)] = "name"
        for sub, key in _CONTAINER_KEYS.items():
            keys[("spec", lst, *sub)] = key
    for lst in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        keys[("status", lst)] = "name"
        keys[("status", lst, "allocatedResourcesStatus")] = "name"
        keys[("status", lst, "allocatedResourcesStatus", "resources")] = "resourceID"
    return keys


@dataclass(frozen=True)
class ResourceType:
    """One served resource (a kind at one group/version)."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    model: type[msgspec.Struct]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_selectors: tuple[str, ...] = ()
    merge_keys: dict[Path, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Storage key prefix, e.g. ``resource.k8s.io/resourceslices``."""
        return f"{self.group}/{self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def supported_fields(self) -> tuple[str, ...]:
        base = ("metadata.name",) + (("metadata.namespace",) if self.namespaced else ())
        return base + self.field_selectors

    def merge_key(self, path: Path) -> str | None:
        return self.merge_keys.get(path) or COMMON_MERGE_KEYS.get(path)


_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
)

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "Namespace",
        "namespaces",
        False,
        core_v1.Namespace,
        short_names=("ns",),
        subresources=("status",),
        field_selectors=("status.phase",),
    ),
    ResourceType(
        "",
        "v1",
        "Node",
        "nodes",
        False,
        core_v1.Node,
        short_names=("no",),
        subresources=("status",),
        field_selectors=("spec.unschedulable",),
        merge_keys={("status", "addresses"): "type", ("spec", "taints"): "key"},
    ),
    ResourceType(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        core_v1.Pod,
        short_names=("po",),
        categories=("all",),
        subresources=("status", "eviction"),
        field_selectors=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
        merge_keys=_pod_merge_keys(),
    ),
    ResourceType(
        "",
        "v1",
        "Event",
        "events",
        True,
        core_v1.Event,
        short_names=("ev",),
        field_selectors=_EVENT_FIELDS,
    ),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, core_v1.ConfigMap, short_names=("cm",)),
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, coordination_v1.Lease),
    ResourceType(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        True,
        apps_v1.ReplicaSet,
        short_names=("rs",),
        categories=("all",),
        subresources=("status",),
    ),
    ResourceType(
        "events.k8s.io", "v1", "Event", "events", True, events_v1.Event, short_names=("ev",)
    ),
    ResourceType(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        True,
        policy_v1.PodDisruptionBudget,
        short_names=("pdb",),
        subresources=("status",),
    ),
    ResourceType(
        "resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False, resource_v1.DeviceClass
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "DeviceTaintRule",
        "devicetaintrules",
        False,
        resource_v1.DeviceTaintRule,
        subresources=("status",),
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceClaim",
        "resourceclaims",
        True,
        resource_v1.ResourceClaim,
        subresources=("status",),
        merge_keys={("status", "reservedFor"): "uid"},
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        True,
        resource_v1.ResourceClaimTemplate,
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "ResourceSlice",
        "resourceslices",
        False,
        resource_v1.ResourceSlice,
        field_selectors=("spec.driver", "spec.nodeName"),
    ),
)

_BY_PLURAL: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in RESOURCES
}
_BY_KIND: dict[tuple[str, str], ResourceType] = {(r.api_version, r.kind): r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PLURAL.get((group, version, plural))


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return _BY_KIND.get((api_version, kind))


def group_versions() -> list[tuple[str, str]]:
    """(group, version) pairs in registry order; the core group is ``""``."""
    seen: list[tuple[str, str]] = []
    for r in RESOURCES:
        if (r.group, r.version) not in seen:
            seen.append((r.group, r.version))
    return seen


# --------------------------------------------------------------------------- discovery


def _api_resources(rt: ResourceType) -> list[JSON]:
    main: JSON = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    out = [main]
    for sub in rt.subresources:
        if sub == "eviction":
            out.append(
                {
                    "name": f"{rt.plural}/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
            )
        else:
            out.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": SUB_VERBS,
                }
            )
    return out


def resource_list(group: str, version: str) -> JSON | None:
    """``APIResourceList`` for ``/api/v1`` or ``/apis/<group>/<version>``."""
    kinds = [r for r in RESOURCES if r.group == group and r.version == version]
    if not kinds:
        return None
    gv = f"{group}/{version}" if group else version
    resources = [item for r in kinds for item in _api_resources(r)]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(group: str) -> JSON | None:
    versions = [v for g, v in group_versions() if g == group and g]
    if not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def api_group_list() -> JSON:
    groups = []
    for g in dict.fromkeys(g for g, _ in group_versions() if g):
        body = api_group(g)
        assert body is not None
        body.pop("kind")
        body.pop("apiVersion")
        groups.append(body)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _aggregated_resource(rt: ResourceType) -> JSON:
    kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    out: JSON = {
        "resource": rt.plural,
        "responseKind": kind,
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": VERBS,
    }
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    subs = []
    for sub in rt.subresources:
        if sub == "eviction":
            subs.append(
                {
                    "subresource": "eviction",
                    "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                    "verbs": ["create"],
                }
            )
        else:
            subs.append({"subresource": sub, "responseKind": kind, "verbs": SUB_VERBS})
    if subs:
        out["subresources"] = subs
    return out


def aggregated_discovery(legacy: bool, api_version: str) -> JSON:
    """``APIGroupDiscoveryList`` for ``/api`` (legacy=True) or ``/apis``."""
    items = []
    groups = [""] if legacy else list(dict.fromkeys(g for g, _ in group_versions() if g))
    for g in groups:
        versions = []
        for gg, v in group_versions():
            if gg != g:
                continue
            resources = [
                _aggregated_resource(r) for r in RESOURCES if r.group == g and r.version == v
            ]
            versions.append({"version": v, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": g, "creationTimestamp": None}, "versions": versions})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    }


# --------------------------------------------------------------------------- OpenAPI v3


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def openapi_root() -> JSON:
    """``/openapi/v3``: one entry per group/version (kubectl uses it to detect
    server-side field validation)."""
    return {
        "paths": {
            _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=drahealth"}
            for g, v in group_versions()
        }
    }


_QUERY_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def openapi_group_version(group: str, version: str) -> JSON | None:
    """A minimal OpenAPI v3 document: the PATCH operations with their query parameters."""
    kinds = [r for r in RESOURCES if r.group == group and r.version == version]
    if not kinds:
        return None
    paths: JSON = {}
    for rt in kinds:
        base = "/" + _gv_path(group, version)
        if rt.namespaced:
            base += "/namespaces/{namespace}"
        item = f"{base}/{rt.plural}/{{name}}"
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        params = [{"name": p, "in": "query", "schema": {"type": "string"}} for p in _QUERY_PARAMS]
        for path in [item] + [f"{item}/{s}" for s in rt.subresources if s != "eviction"]:
            paths[path] = {
                "patch": {
                    "operationId": f"patch{rt.kind}",
                    "x-kubernetes-group-version-kind": gvk,
                    "x-kubernetes-action": "patch",
                    "parameters": params,
                    "responses": {"200": {"description": "OK"}},
                }
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (drahealth embedded)", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }
